"""Inner-loop learning rates: fixed, learned per layer and step (MAML++), or learned per parameter (Meta-SGD)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from units_lightning.engines.base import split_steps

__all__ = ["InnerLearningRates", "InnerLRMode"]

InnerLRMode = Literal["fixed", "per_layer_per_step", "per_parameter"]


class InnerLearningRates(nn.Module):
    """The step size of every inner-loop update ``w <- w - lr(name, step) * grad``.

    - ``"fixed"``: one constant for every tensor and step (MAML).
    - ``"per_layer_per_step"``: a learned scalar per parameter tensor and inner step, initialised to
      ``init`` (MAML++'s LSLR, the paper's setup). Steps beyond ``steps`` (evaluation with more inner
      steps than training) reuse the last step's rates.
    - ``"per_parameter"``: a learned rate per parameter entry, shared by all steps (Meta-SGD).

    Learned rates are meta-parameters: they receive meta-gradients and are trained by the outer optimiser.

    Args:
        parameters: name -> tensor of the weights the inner loop updates.
        init: the (initial) learning rate.
        mode: one of the modes above.
        steps: inner steps in training (sizes the per-step rates).

    Example:
        >>> rates = InnerLearningRates({"w": torch.zeros(2, 3)}, 0.1, "per_layer_per_step", steps=2)
        >>> rates("w", 0).shape, rates("w", 7).item() == rates("w", 1).item()
        (torch.Size([]), True)
    """

    def __init__(self, parameters: dict[str, Tensor], init: float = 0.1, mode: InnerLRMode = "fixed", steps: int = 1):
        super().__init__()
        if mode not in ("fixed", "per_layer_per_step", "per_parameter"):
            raise ValueError(f"inner_lr_mode must be 'fixed', 'per_layer_per_step' or 'per_parameter', got {mode!r}")
        self.mode, self.init, self.steps = mode, float(init), max(1, int(steps))
        self.names = list(parameters)
        self.rates = nn.ParameterDict()
        for name, weight in parameters.items():
            if mode == "per_layer_per_step":
                self.rates[_key(name)] = nn.Parameter(torch.full((self.steps,), self.init, dtype=weight.dtype))
            elif mode == "per_parameter":
                self.rates[_key(name)] = nn.Parameter(torch.full_like(weight, self.init, requires_grad=False))

    def forward(self, name: str, step: int) -> float | Tensor:
        """The learning rate of parameter ``name`` at inner step ``step`` (a float when fixed)."""
        if self.mode == "fixed":
            return self.init
        rate = self.rates[_key(name)]
        return rate[min(step, self.steps - 1)] if self.mode == "per_layer_per_step" else rate

    def per_step(self, steps: int) -> list[dict[str, float | Tensor]]:
        """The rates of ``steps`` inner steps, ``[step][name]``, equal to ``self(name, step)``; learned per-step rates
        split once (``split_steps``: fewer kernels in the meta-gradient than a split per step)."""
        if self.mode != "per_layer_per_step":
            return [{name: self(name, step) for name in self.names} for step in range(steps)]
        return split_steps({name: self.rates[_key(name)] for name in self.names}, steps)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, init={self.init}, steps={self.steps}"


def _key(name: str) -> str:
    """Parameter names hold dots, which ``ParameterDict`` keys may not."""
    return name.replace(".", "__")

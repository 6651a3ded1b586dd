"""The reference engine: learn2learn's differentiable ``clone_module`` / ``update_module``, one task at a time."""

from __future__ import annotations

import contextlib
import io

import torch
from torch import Tensor, nn

from units_lightning.engines.base import InnerLoss, accepts_step, inner_loop_parameters
from units_lightning.engines.inner_lr import InnerLearningRates, InnerLRMode

__all__ = ["Learn2LearnEngine", "import_learn2learn"]


def import_learn2learn():
    """Import learn2learn quietly (its gym dependency prints a deprecation notice on import).

    Raises:
        ImportError: with the install recipe when learn2learn is missing.
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            import learn2learn
    except ImportError as error:
        raise ImportError(
            "learn2learn is required by Learn2LearnEngine (model.engine=learn2learn). Run scripts/setup.sh, or "
            "install it by hand: pip install cython numpy setuptools wheel && pip install --no-build-isolation "
            "--no-deps -C--build-option=build_ext learn2learn==0.2.0; or use model.engine=batched"
        ) from error
    return learn2learn


class Learn2LearnEngine(nn.Module):
    """Per-task MAML the way learn2learn's ``MAML`` and ``MetaSGD`` run it: the reference engine.

    For each task: ``clone_module`` the backbone, then ``steps`` times compute the support loss, its
    gradients (kept in the graph when ``create_graph``) and ``update_module`` with ``-lr * grad``. That is
    ``MAML.adapt`` for a fixed rate and ``MetaSGD.adapt`` for per-parameter rates, extended to
    per-layer-per-step rates and per-step batch norm, which learn2learn's classes do not offer.

    Args:
        model: the backbone whose initialisation is meta-learned.
        inner_lr: inner-loop learning rate (the initial one when learned).
        inner_lr_mode: "fixed" (MAML), "per_layer_per_step" (MAML++) or "per_parameter" (Meta-SGD).
        inner_steps: inner steps in training (sizes per-step rates).
    """

    def __init__(
        self, model: nn.Module, inner_lr: float = 0.1, inner_lr_mode: InnerLRMode = "fixed", inner_steps: int = 1
    ):
        super().__init__()
        l2l = import_learn2learn()
        # Keep the functions, not the module object: a module object cannot be deep-copied or pickled.
        self._clone_module, self._update_module = l2l.clone_module, l2l.update_module
        self.model = model
        self.inner_lr = InnerLearningRates(inner_loop_parameters(model), inner_lr, inner_lr_mode, inner_steps)
        self._step_kwarg = accepts_step(model)

    def adapt(
        self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool
    ) -> list[nn.Module]:
        return [self._adapt_task(x, y, loss, steps, create_graph) for x, y in zip(support_x, support_y, strict=True)]

    def predict(self, adapted: list[nn.Module], query_x: Tensor, task_index: Tensor) -> Tensor:
        if query_x.shape[0] == 0:
            return query_x.new_zeros(0, query_x.shape[1], self._num_outputs(adapted))
        step = adapted[0].adapted_steps
        return torch.stack(
            [self._forward(adapted[int(t)], x, step) for x, t in zip(query_x, task_index.tolist(), strict=True)]
        )

    def predict_sets(self, adapted: list[nn.Module], query_x: Tensor) -> Tensor:
        step = adapted[0].adapted_steps
        return torch.stack(
            [
                torch.stack([self._forward(net, x, step) for x in sets])
                for net, sets in zip(adapted, query_x, strict=True)
            ]
        )

    def _adapt_task(self, x: Tensor, y: Tensor, loss: InnerLoss, steps: int, create_graph: bool) -> nn.Module:
        learner = self._clone_module(self.model)
        names = list(dict(learner.named_parameters()))
        adaptable = set(inner_loop_parameters(learner))
        for step in range(steps):
            weights = [p for name, p in learner.named_parameters() if name in adaptable]
            task_loss = loss(self._forward(learner, x, step), y)
            grads = iter(torch.autograd.grad(task_loss, weights, create_graph=create_graph, allow_unused=True))
            updates = [_update(self.inner_lr(n, step), next(grads)) if n in adaptable else None for n in names]
            self._update_module(learner, updates=updates)
        learner.adapted_steps = steps
        return learner

    def _forward(self, model: nn.Module, x: Tensor, step: int) -> Tensor:
        return model(x, step=step) if self._step_kwarg else model(x)

    @staticmethod
    def _num_outputs(adapted: list[nn.Module]) -> int:
        return list(adapted[0].parameters())[-1].shape[0]


def _update(lr: float | Tensor, grad: Tensor | None) -> Tensor | None:
    """``-lr * grad``; None (no change) for a weight the loss does not reach."""
    return None if grad is None else -lr * grad

"""The inner loop behind a small interface: adapt to support sets, then predict on query sets."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor, nn

__all__ = ["Engine", "InnerLoss", "accepts_step", "inner_loop_parameters"]

InnerLoss = Callable[[Tensor, Tensor], Tensor]
"""``loss(logits, labels) -> scalar`` used for the inner-loop (support set) updates."""


class Engine(Protocol):
    """How the inner loop runs. The LightningModule only ever calls these two methods.

    ``adapt`` returns an opaque handle to the adapted (fast) weights of every task; ``predict`` runs
    query sets through them. Both keep the autograd graph back to the meta-parameters (second order
    when ``create_graph``), so the caller decides what to differentiate.

    Every engine holds the backbone as ``model`` and the inner learning rates as ``inner_lr``
    (``InnerLearningRates``), so their state dicts are interchangeable.
    """

    def adapt(self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool) -> Any:
        """Adapt to each task's support set.

        Args:
            support_x: (T, S, C, H, W) support images of T tasks.
            support_y: (T, S) support labels.
            loss: inner-loop loss.
            steps: gradient steps per task.
            create_graph: keep the graph of the inner updates (second-order meta-gradients).
        """

    def predict(self, adapted: Any, query_x: Tensor, task_index: Tensor) -> Tensor:
        """Logits of query sets through their task's adapted weights.

        Args:
            adapted: what ``adapt`` returned.
            query_x: (K, M, C, H, W) K query sets of M images; each set is normalised on its own.
            task_index: (K,) the task each query set belongs to.

        Returns:
            (K, M, N) logits.
        """

    def predict_sets(self, adapted: Any, query_x: Tensor) -> Tensor:
        """Logits of every task's own query sets (scoring candidates, evaluation).

        Args:
            adapted: what ``adapt`` returned for T tasks.
            query_x: (T, Q, M, C, H, W) Q query sets of M images per task; each set is normalised on its own.

        Returns:
            (T, Q, M, N) logits.
        """


def inner_loop_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters the inner loop updates: all but those the model lists in ``meta_only_parameters``.

    A backbone with per-step batch-norm weights meta-learns them only (MAML++ and the authors' code).
    """
    meta_only = set(getattr(model, "meta_only_parameters", ()))
    return {name: p for name, p in model.named_parameters() if name not in meta_only}


def split_steps(stacked: dict[str, Tensor], steps: int) -> list[dict[str, Tensor]]:
    """``[step][name]``: the slice of inner step ``step`` of each tensor stacked along a first dimension of steps
    (later steps reuse the last slice), each tensor split once, so that the meta-gradient reaches it through one
    backward node (a stack) instead of one per step (a zero-filled tensor, a copy and an addition each)."""
    split = {name: tensor.unbind() for name, tensor in stacked.items()}
    return [{name: parts[min(step, len(parts) - 1)] for name, parts in split.items()} for step in range(steps)]


def per_step_slices(model: nn.Module, steps: int) -> list[dict[str, Tensor]]:
    """``split_steps`` of the parameters the model lists in ``per_step_parameters``: passed to the model in place of
    the stacked tensors, they compute what ``forward(x, step)`` does."""
    per_step = getattr(model, "per_step_parameters", ())
    return split_steps({name: p for name, p in model.named_parameters() if name in per_step}, steps)


def accepts_step(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes the inner step as ``step=`` (per-step batch norm)."""
    return "step" in inspect.signature(model.forward).parameters

"""The inner loop behind a small interface: adapt to support sets, then predict on query sets."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

__all__ = [
    "CapturingEngine",
    "Engine",
    "EvaluatingEngine",
    "InnerLoss",
    "accepts_step",
    "adapt_and_predict_sets",
    "inner_loop_parameters",
]

InnerLoss = Callable[[Tensor, Tensor], Tensor]
"""``loss(logits, labels) -> scalar`` used for the inner-loop (support set) updates."""


class Engine(Protocol):
    """How the inner loop runs: what the LightningModule calls of every engine.

    ``adapt`` returns an opaque handle to the adapted (fast) weights of every task; ``predict`` runs
    query sets through them. Both keep the autograd graph back to the meta-parameters (second order
    when ``create_graph``), so the caller decides what to differentiate.

    Every engine holds the backbone as ``model`` and the inner learning rates as ``inner_lr``
    (``InnerLearningRates``), so their state dicts are interchangeable. What only some engines can do is declared
    apart (``CapturingEngine``, ``EvaluatingEngine``) and checked with ``isinstance``.
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


@runtime_checkable
class CapturingEngine(Protocol):
    """An engine around which a caller may replay a whole training step as CUDA graphs (``BatchedEngine``).

    ``captured_step.CapturedStep`` replays the step when ``captures`` holds, runs the engine's inner loop eagerly
    inside the capture (``eager()``: graphs do not nest), and resolves ``capture="auto"`` by the length of the run
    (``use_capture``).
    """

    capture: str
    """The capture setting: "auto", "none", "cuda_graph" or "compile"."""

    @property
    def captures(self) -> bool:
        """Whether a caller may replay a whole step around this engine as a CUDA graph."""

    def eager(self) -> AbstractContextManager[None]:
        """Inside the block, the inner loop runs eagerly (it is itself being captured)."""

    def use_capture(self, capture: Literal["cuda_graph", "compile"]) -> None:
        """Switch to replaying the inner loop as CUDA graphs, or to compiling it."""


@runtime_checkable
class EvaluatingEngine(Protocol):
    """An engine that adapts and predicts evaluation batches in one call (``BatchedEngine``: one CUDA graph per shape
    on a GPU); the module uses it for every evaluation batch whose query sets share one shape."""

    def evaluate(self, support_x: Tensor, support_y: Tensor, query_x: Tensor, loss: InnerLoss, steps: int) -> Tensor:
        """Adapt to each support set (first order) and return the detached (T, Q, M, N) logits of its query sets
        (``query_x``: (T, Q, M, C, H, W))."""


def adapt_and_predict_sets(
    engine: Engine, support_x: Tensor, support_y: Tensor, query_sets: Sequence[Tensor], loss: InnerLoss, steps: int
) -> list[Tensor]:
    """Adapt once to each support set (first order), then predict several query sets of each task: through
    ``evaluate`` where the engine has it (``EvaluatingEngine``) and the sets share one shape, else in one
    ``predict_sets`` pass (sets of one shape; each is still normalised on its own) or in one pass per set.

    Args:
        support_x: (T, S, C, H, W); support_y: (T, S); query_sets: tensors of shape (T, M_i, C, H, W).

    Returns:
        one (T, M_i, N) logits tensor per query set, detached.
    """
    one_shape = len({q.shape for q in query_sets}) == 1
    if isinstance(engine, EvaluatingEngine) and one_shape:
        return list(engine.evaluate(support_x, support_y, torch.stack(list(query_sets), dim=1), loss, steps).unbind(1))
    adapted = engine.adapt(support_x, support_y, loss, steps, create_graph=False)
    # Nothing flows back from these logits: predicted without recording a backward, so no activations of the query
    # images are kept (a CIFAR-FS 5w1s test of a top-3 ensemble, 20 tasks, was killed at 24 GB on the CPU with them)
    with torch.no_grad():
        if one_shape:
            return list(engine.predict_sets(adapted, torch.stack(list(query_sets), dim=1)).unbind(1))
        return [engine.predict_sets(adapted, q.clone().unsqueeze(1))[:, 0] for q in query_sets]


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

"""Units-ST: draw J candidate tasks, label only the I most uncertain."""

from __future__ import annotations

import torch
from torch import Tensor

from units_lightning.samplers.base import TaskSampler

__all__ = ["SingleTaskSelectionSampler"]


class SingleTaskSelectionSampler(TaskSampler):
    """Units-ST: ``candidates`` tasks (J) with one query set each; the ``tasks`` (I) most uncertain are kept.

    Every candidate support set is adapted to and scored, so a step costs J adaptations for I meta-updates:
    this is the simple baseline that the multi-query sampler improves on.

    Args:
        tasks: tasks kept per step (I).
        candidates: tasks drawn per step (J >= I).
        warmup_steps: steps before selection starts (the first I candidates are kept until then).
    """

    def __init__(self, tasks: int = 8, candidates: int = 16, warmup_steps: int = 0):
        super().__init__(tasks=tasks, query_sets=1, warmup_steps=warmup_steps)
        if candidates < tasks:
            raise ValueError(f"candidates (J={candidates}) must be >= tasks (I={tasks})")
        self.candidates = candidates

    @property
    def num_candidates(self) -> int:
        return self.candidates

    def chosen_count(self, step: int) -> int:
        """The I kept tasks' query sets, during warm-up too."""
        return self.tasks

    def choose(self, scores: Tensor) -> Tensor:
        kept = scores[:, :1].topk(self.tasks, dim=0).indices  # scatter_ of a scalar: no copy to the GPU, no wait
        return torch.zeros_like(scores, dtype=torch.bool).scatter_(0, kept, True)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(tasks={self.tasks}, candidates={self.candidates}, warmup_steps={self.warmup_steps})"
        )

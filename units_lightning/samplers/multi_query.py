"""Units-ML: one support set, several unlabeled query sets, label only the most uncertain."""

from __future__ import annotations

import torch
from torch import Tensor

from units_lightning.samplers.base import TaskSampler

__all__ = ["MultiQuerySampler"]


class MultiQuerySampler(TaskSampler):
    """The paper's multi-query task formulation (Units-ML).

    Each of the ``tasks`` support sets comes with ``query_sets`` unlabeled query sets of the same classes;
    after one adaptation per support set every query set is scored (a forward pass, no backward) and only
    the most uncertain one per task is labeled and trained on.

    Args:
        tasks: support sets per step (I).
        query_sets: candidate query sets per support set (Q; 8 in the paper).
        warmup_steps: steps before selection starts (the paper: 5 epochs standard, 100 steps under a
            label budget). Until then the first query set of each task is used.
    """

    def __init__(self, tasks: int = 8, query_sets: int = 8, warmup_steps: int = 0):
        super().__init__(tasks=tasks, query_sets=query_sets, warmup_steps=warmup_steps)

    def chosen_count(self, step: int) -> int:
        """One query set per task, during warm-up too."""
        return self.tasks

    def choose(self, scores: Tensor) -> Tensor:
        # scatter_ of a scalar: indexed assignment of True would copy the scalar to the GPU and wait for it
        return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, scores.argmax(dim=1, keepdim=True), True)

"""Units-NTS / MAML: tasks drawn uniformly, every query set labeled."""

from __future__ import annotations

from units_lightning.samplers.base import TaskSampler

__all__ = ["RandomSampler"]


class RandomSampler(TaskSampler):
    """Draws ``tasks`` tasks with one query set each and labels all of them (no task selection).

    With ``EvidentialLoss`` this is Units-NTS; with ``CrossEntropyLoss`` it is plain MAML.

    Args:
        tasks: tasks per step (meta-batch size).
    """

    uses_scores = False

    def __init__(self, tasks: int = 8):
        super().__init__(tasks=tasks, query_sets=1, warmup_steps=0)

    def chosen_count(self, step: int) -> int:
        """Every drawn task's one query set."""
        return self.tasks

"""``TaskMean``: the mean over tasks of a per-task average, with its 95% confidence interval."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from units_lightning.metrics.functional import mean_confidence_interval

__all__ = ["TaskMean"]


class TaskMean(Metric):
    """Mean over tasks of a per-task value (e.g. accuracy), with the half-width ``1.96 std / sqrt(tasks)``.

    Each task first averages its queries; the tasks are then the samples of the confidence interval, as the
    few-shot protocol reports it. States are a sum, a sum of squares and a count, summed across processes,
    so the result under data-parallel evaluation equals that of one process seeing every task.

    Example:
        >>> metric = TaskMean()
        >>> metric.update(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))  # two tasks of two queries: 0.5 and 1.0
        >>> metric.update(torch.tensor([[1.0, 1.0]]))
        >>> [round(float(x), 4) for x in metric.compute()]  # mean 5/6, sample std 0.2887 over 3 tasks
        [0.8333, 0.3267]
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("total", "total_squares", "count"):
            self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        """Add tasks.

        Args:
            values: (T, M) per-query values of T tasks (averaged over M), or (T,) per-task values.
        """
        per_task = values.detach().to(torch.float64)
        if per_task.dim() > 1:
            per_task = per_task.flatten(1).mean(dim=1)
        self.total += per_task.sum()
        self.total_squares += (per_task**2).sum()
        self.count += per_task.numel()

    def compute(self) -> tuple[Tensor, Tensor]:
        """(mean, 95% half-width) over the tasks seen; ``nan`` before any."""
        return mean_confidence_interval(self.total, self.total_squares, self.count)

"""``VacuityThresholdAccuracy``: accuracy and coverage of the queries below each vacuity threshold."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from units_lightning.metrics.functional import counts_to_curve, threshold_counts

__all__ = ["VacuityThresholdAccuracy"]


class VacuityThresholdAccuracy(Metric):
    """Accuracy and coverage (fraction kept) of the queries with vacuity below each threshold.

    The paper's "Units-ML 0.2" row is the accuracy at threshold 0.2. States are per-threshold counts, summed
    across processes (exact under data-parallel evaluation, and of fixed size however many queries).

    Args:
        thresholds: the vacuity thresholds; a query is kept at ``t`` when its vacuity is ``< t``.

    Example:
        >>> metric = VacuityThresholdAccuracy([0.1, 0.2])
        >>> metric.update(torch.tensor([True, False, True, False]), torch.tensor([0.05, 0.15, 0.25, 0.6]))
        >>> accuracy, coverage = metric.compute()
        >>> accuracy.tolist(), coverage.tolist()
        ([1.0, 0.5], [0.25, 0.5])
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, thresholds: Sequence[float], **kwargs) -> None:
        super().__init__(**kwargs)
        if not len(thresholds):
            raise ValueError("give at least one vacuity threshold")
        self.thresholds = [float(t) for t in thresholds]
        size = len(self.thresholds)
        self.add_state("kept", default=torch.zeros(size, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("kept_correct", default=torch.zeros(size, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, correct: Tensor, vacuity: Tensor) -> None:
        """Add queries: ``correct`` bool and ``vacuity`` of the same shape (any)."""
        thresholds = torch.tensor(self.thresholds, dtype=torch.float64, device=vacuity.device)
        kept, kept_correct = threshold_counts(
            correct.detach().reshape(-1), vacuity.detach().reshape(-1).to(torch.float64), thresholds
        )
        self.kept += kept
        self.kept_correct += kept_correct
        self.total += correct.numel()

    def compute(self) -> tuple[Tensor, Tensor]:
        """(accuracy, coverage), each (len(thresholds),); accuracy ``nan`` where no query is kept."""
        return counts_to_curve(self.kept, self.kept_correct, self.total)

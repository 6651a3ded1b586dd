"""``ExpectedCalibrationError`` of the expected (Dirichlet mean) probabilities."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from units_lightning.metrics.functional import calibration_bins, ece_from_bins

__all__ = ["ExpectedCalibrationError"]


class ExpectedCalibrationError(Metric):
    """ECE of the top-class probability over equal-width confidence bins.

    States are per-bin counts and sums, summed across processes (exact under data-parallel evaluation).

    Args:
        bins: number of equal-width bins on [0, 1].

    Example:
        >>> metric = ExpectedCalibrationError(bins=4)
        >>> metric.update(torch.tensor([[0.9, 0.1], [0.9, 0.1]]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[0.6, 0.4], [0.3, 0.7]]), torch.tensor([0, 1]))
        >>> round(float(metric.compute()), 4)
        0.375
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(self, bins: int = 15, **kwargs) -> None:
        super().__init__(**kwargs)
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        self.bins = bins
        for name in ("count", "confidence_sum", "correct_sum"):
            self.add_state(name, default=torch.zeros(bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probability: Tensor, labels: Tensor) -> None:
        """Add queries: ``probability`` (..., N) and ``labels`` (...) class indices."""
        count, confidence_sum, correct_sum = calibration_bins(
            probability.detach().reshape(-1, probability.shape[-1]), labels.reshape(-1), self.bins
        )
        self.count += count
        self.confidence_sum += confidence_sum
        self.correct_sum += correct_sum

    def compute(self) -> Tensor:
        return ece_from_bins(self.count, self.confidence_sum, self.correct_sum)

"""``RiskCoverage``: selective accuracy of the most confident queries and the area under the risk-coverage curve."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from units_lightning.metrics.functional import DEFAULT_COVERAGES, selective_accuracies_and_aurc

__all__ = ["RiskCoverage"]


class RiskCoverage(Metric):
    """Rank queries by uncertainty (vacuity); report accuracy of the top fractions and the AURC.

    Ranking needs every query, so the states are the concatenated per-query correctness and uncertainty,
    gathered across processes (600 tasks x 75 queries is 45,000 pairs: a few hundred kilobytes).

    Args:
        coverages: fractions of the most confident queries whose accuracy ``compute`` returns.

    Example:
        >>> metric = RiskCoverage(coverages=[1.0, 0.5])
        >>> metric.update(torch.tensor([True, False]), torch.tensor([0.1, 0.2]))
        >>> metric.update(torch.tensor([True, True]), torch.tensor([0.3, 0.4]))
        >>> accuracy, aurc = metric.compute()
        >>> accuracy.tolist(), round(float(aurc), 4)  # risks 0, 1/2, 1/3, 1/4
        ([0.75, 0.5], 0.2708)
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, coverages: Sequence[float] = DEFAULT_COVERAGES, **kwargs) -> None:
        super().__init__(**kwargs)
        for coverage in coverages:
            if not 0.0 < coverage <= 1.0:
                raise ValueError(f"coverages must lie in (0, 1], got {coverage}")
        self.coverages = [float(c) for c in coverages]
        self.add_state("correct", default=[], dist_reduce_fx="cat")
        self.add_state("uncertainty", default=[], dist_reduce_fx="cat")

    def update(self, correct: Tensor, uncertainty: Tensor) -> None:
        """Add queries: ``correct`` bool and ``uncertainty`` (lower = more confident) of the same shape."""
        self.correct.append(correct.detach().reshape(-1).bool())
        self.uncertainty.append(uncertainty.detach().reshape(-1).float())

    def compute(self) -> tuple[Tensor, Tensor]:
        """(selective accuracy at each coverage, AURC), from one ranking of the queries."""
        return selective_accuracies_and_aurc(*self._gathered(), self.coverages)

    def _gathered(self) -> tuple[Tensor, Tensor]:
        if isinstance(self.correct, list) and not self.correct:
            return torch.zeros(0, dtype=torch.bool), torch.zeros(0)
        # Ranked where the states live: on a GPU a few kernels. On the CPU, indexing a few thousand queries wakes the
        # whole thread pool: 0.1 s a validation on a busy 32-core GPU host (docs/PERFORMANCE.md).
        return dim_zero_cat(self.correct), dim_zero_cat(self.uncertainty)

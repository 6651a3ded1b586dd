"""``DetectionAUROC``: how well an uncertainty score tells shifted (out-of-distribution) queries from the rest."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from units_lightning.metrics.functional import auroc

__all__ = ["DetectionAUROC"]


class DetectionAUROC(Metric):
    """AUROC of a score (vacuity) for detecting positives (out-of-distribution queries) among negatives.

    States are the concatenated scores and flags, gathered across processes; ties count one half.

    Example:
        >>> metric = DetectionAUROC()
        >>> metric.update(torch.tensor([0.1, 0.4]), positive=False)  # in-distribution vacuities
        >>> metric.update(torch.tensor([0.35, 0.8]), positive=True)  # out-of-distribution vacuities
        >>> metric.compute()
        tensor(0.7500)
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("positive", default=[], dist_reduce_fx="cat")

    def update(self, scores: Tensor, positive: Tensor | bool) -> None:
        """Add scores (any shape) with their flags (same shape, or one bool for all)."""
        scores = scores.detach().reshape(-1).float()
        flags = torch.as_tensor(positive, device=scores.device).bool()
        self.scores.append(scores)
        self.positive.append(flags.expand_as(scores).reshape(-1) if flags.dim() == 0 else flags.reshape(-1))

    def compute(self) -> Tensor:
        if isinstance(self.scores, list) and not self.scores:
            return auroc(torch.zeros(0), torch.zeros(0, dtype=torch.bool))
        return auroc(dim_zero_cat(self.scores).cpu(), dim_zero_cat(self.positive).cpu())

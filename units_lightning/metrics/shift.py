"""``ShiftMetrics``: accuracy, vacuity and detection AUROC of shifted (out-of-distribution) query sets."""

from __future__ import annotations

import math

from torch import Tensor, nn

from units_lightning.metrics.auroc import DetectionAUROC
from units_lightning.metrics.task_mean import TaskMean
from units_lightning.metrics.uncertainty import synced_count

__all__ = ["ShiftMetrics"]


def _number(value: Tensor | float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


class ShiftMetrics(nn.Module):
    """What happens to predictions when the query set is shifted (rotated, scaled, another dataset).

    Reports the accuracy (when the shifted queries keep their classes) and mean vacuity of the shifted query
    sets, each with a 95% CI over tasks, and the AUROC of vacuity for telling the shifted queries (positives)
    from the clean queries of the same tasks (negatives). All states reduce exactly across processes.

    Example:
        >>> import torch
        >>> metrics = ShiftMetrics()
        >>> metrics.update(torch.tensor([[0.1, 0.4]]), torch.tensor([[0.35, 0.8]]), torch.tensor([[True, False]]))
        >>> result = metrics.compute()
        >>> result["accuracy"]["mean"], round(result["vacuity"]["mean"], 3), result["auroc"]
        (0.5, 0.575, 0.75)
    """

    def __init__(self):
        super().__init__()
        self.accuracy = TaskMean()
        self.vacuity = TaskMean()
        self.auroc = DetectionAUROC()

    def update(self, clean_vacuity: Tensor, shifted_vacuity: Tensor, shifted_correct: Tensor | None = None) -> None:
        """Add tasks: (T, M) vacuity of the clean and of the shifted queries, and correctness if defined."""
        self.vacuity.update(shifted_vacuity)
        if shifted_correct is not None:
            self.accuracy.update(shifted_correct.float())
        self.auroc.update(clean_vacuity, positive=False)
        self.auroc.update(shifted_vacuity, positive=True)

    def compute(self) -> dict[str, object]:
        """``{"accuracy": {"mean", "ci95"} or None, "vacuity": {"mean", "ci95"}, "auroc": float}``."""
        result: dict[str, object] = {"accuracy": None}
        if synced_count(self.accuracy) > 0:
            mean, half = self.accuracy.compute()
            result["accuracy"] = {"mean": _number(mean), "ci95": _number(half)}
        mean, half = self.vacuity.compute()
        result["vacuity"] = {"mean": _number(mean), "ci95": _number(half)}
        result["auroc"] = _number(self.auroc.compute())
        return result

    def reset(self) -> None:
        for metric in (self.accuracy, self.vacuity, self.auroc):
            metric.reset()

"""``UncertaintyMetrics``: every evaluation quantity of one stage (validation or test), as one module."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from torchmetrics import Metric

from units_lightning import keys
from units_lightning.keys import BELIEFS, REPORTED_VACUITY_THRESHOLDS
from units_lightning.metrics.calibration import ExpectedCalibrationError
from units_lightning.metrics.functional import DEFAULT_COVERAGES, curve_thresholds
from units_lightning.metrics.risk_coverage import RiskCoverage
from units_lightning.metrics.task_mean import TaskMean
from units_lightning.metrics.vacuity_threshold import VacuityThresholdAccuracy

__all__ = ["UncertaintyMetrics", "synced_count"]


def _number(value: Tensor | float) -> float | None:
    """A float for JSON and loggers; ``None`` for nan (no query kept, no tasks)."""
    value = float(value)
    return None if math.isnan(value) else value


def synced_count(metric: Metric, state: str = "count") -> int:
    """A count state of ``metric`` summed over processes (read outside ``compute``, which syncs by itself)."""
    with metric.sync_context():
        return int(getattr(metric, state))


class UncertaintyMetrics(nn.Module):
    """Accuracy with its 95% CI over tasks, mean beliefs, accuracy and coverage below vacuity thresholds (and
    the whole curve), selective accuracy of the most confident queries, AURC and ECE.

    The most confident queries are ranked twice: by vacuity (the paper's score) and by the largest expected class
    probability, the usual misclassification-detection baseline of any classifier. The second makes models trained
    without the evidential loss comparable: for them vacuity only measures the total evidence.

    Feed it what ``UnitsMAML``'s evaluation steps return; every part is a torchmetrics ``Metric`` whose state
    is reduced across processes (sums, or gathered lists for the ranking quantities).

    Args:
        vacuity_thresholds: thresholds reported as single numbers (the paper's "Units-ML 0.1 / 0.2" rows).
        coverages: fractions of most confident queries (lowest vacuity) whose accuracy is reported.
        calibration_bins: equal-width bins of the expected calibration error.
        curve_step: spacing of the threshold grid of the whole accuracy-vs-threshold curve.
    """

    def __init__(
        self,
        vacuity_thresholds: Sequence[float] = REPORTED_VACUITY_THRESHOLDS,
        coverages: Sequence[float] = DEFAULT_COVERAGES,
        calibration_bins: int = 15,
        curve_step: float = 0.05,
    ):
        super().__init__()
        self.vacuity_thresholds = [float(t) for t in vacuity_thresholds]
        self.coverages = [float(c) for c in coverages]
        if len({keys.threshold_suffix(t) for t in self.vacuity_thresholds}) != len(self.vacuity_thresholds):
            raise ValueError(f"vacuity_thresholds must differ in their first two decimals, got {vacuity_thresholds}")
        self.accuracy = TaskMean()
        self.beliefs = nn.ModuleDict({name: TaskMean() for name in BELIEFS})
        self.curve = VacuityThresholdAccuracy(curve_thresholds(self.vacuity_thresholds, curve_step))
        self.risk_coverage = RiskCoverage(self.coverages)
        self.risk_coverage_probability = RiskCoverage(self.coverages)
        self.calibration = ExpectedCalibrationError(calibration_bins)

    def num_tasks(self) -> int:
        """Tasks seen, summed over processes (every process must call it under data-parallel evaluation)."""
        return synced_count(self.accuracy)

    def update(self, outputs: Mapping[str, Tensor]) -> None:
        """Add a batch of tasks.

        Args:
            outputs: (T, M) ``correct``, ``vacuity``, ``dissonance``, ``incorrect_belief``, ``correct_belief``,
                ``labels``; (T, M, N) ``probability``: what ``UnitsMAML.validation_step`` returns.
        """
        correct, vacuity = outputs["correct"], outputs["vacuity"]
        self.accuracy.update(correct.float())
        for name, metric in self.beliefs.items():
            metric.update(outputs[name])
        self.curve.update(correct, vacuity)
        self.risk_coverage.update(correct, vacuity)
        self.risk_coverage_probability.update(correct, 1.0 - outputs["probability"].amax(dim=-1))
        self.calibration.update(outputs["probability"], outputs["labels"])

    def compute(self) -> dict[str, Any]:
        """Everything as plain Python numbers and lists (``None`` where undefined), ready for JSON.

        Returns:
            dict with ``tasks``, ``queries``; ``accuracy`` and each belief as ``{"mean", "ci95"}``;
            ``vacuity_thresholds``: ``[{"threshold", "accuracy", "coverage"}]``; ``threshold_curve``:
            ``{"threshold": [...], "accuracy": [...], "coverage": [...]}``; ``selective_accuracy``:
            ``[{"coverage", "accuracy"}]``; ``aurc``; the same two ranked by the largest expected probability,
            ``selective_accuracy_max_probability`` and ``aurc_max_probability``; ``ece``.
        """
        mean, half = self.accuracy.compute()
        curve_accuracy, curve_coverage = self.curve.compute()
        thresholds = self.curve.thresholds
        results: dict[str, Any] = {
            "tasks": synced_count(self.accuracy),
            "queries": synced_count(self.curve, "total"),
            "accuracy": {"mean": _number(mean), "ci95": _number(half)},
        }
        for name, metric in self.beliefs.items():
            belief_mean, belief_half = metric.compute()
            results[name] = {"mean": _number(belief_mean), "ci95": _number(belief_half)}
        results["vacuity_thresholds"] = [
            {
                "threshold": t,
                "accuracy": _number(curve_accuracy[thresholds.index(t)]),
                "coverage": _number(curve_coverage[thresholds.index(t)]),
            }
            for t in self.vacuity_thresholds
        ]
        results["threshold_curve"] = {
            "threshold": thresholds,
            "accuracy": [_number(a) for a in curve_accuracy],
            "coverage": [_number(c) for c in curve_coverage],
        }
        for ranked, ranking in (("", self.risk_coverage), ("_max_probability", self.risk_coverage_probability)):
            selective, aurc = ranking.compute()
            results[f"selective_accuracy{ranked}"] = [
                {"coverage": c, "accuracy": _number(a)} for c, a in zip(self.coverages, selective, strict=True)
            ]
            results[f"aurc{ranked}"] = _number(aurc)
        results["ece"] = _number(self.calibration.compute())
        return results

    def scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        """The single numbers of ``compute()``'s results under their stable logged names (``None`` as nan).

        ``acc`` and the four beliefs (their means over the tasks), ``acc_ci95``, ``acc_vacuity_below_<t>``,
        ``coverage_vacuity_below_<t>`` (``<t>`` as ``0p20``), ``selective_acc_<pct>``, ``aurc``,
        ``selective_acc_max_probability_<pct>``, ``aurc_max_probability``, ``ece`` (names of ``units_lightning.keys``).
        """
        values: dict[str, float | None] = {keys.ACC: results["accuracy"]["mean"]}
        values.update({name: results[name]["mean"] for name in keys.BELIEFS})
        values[keys.ACC_CI95] = results["accuracy"]["ci95"]
        for row in results["vacuity_thresholds"]:
            values[keys.acc_vacuity_below(row["threshold"])] = row["accuracy"]
            values[keys.coverage_vacuity_below(row["threshold"])] = row["coverage"]
        for row in results["selective_accuracy"]:
            values[keys.selective_acc(row["coverage"])] = row["accuracy"]
        for row in results["selective_accuracy_max_probability"]:
            values[keys.selective_acc_max_probability(row["coverage"])] = row["accuracy"]
        values[keys.AURC], values[keys.ECE] = results["aurc"], results["ece"]
        values[keys.AURC_MAX_PROBABILITY] = results["aurc_max_probability"]
        return {k: math.nan if v is None else v for k, v in values.items()}

    def reset(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset") and not isinstance(module, nn.ModuleDict):
                module.reset()

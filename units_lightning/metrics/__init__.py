"""Evaluation metrics: pure maths in ``functional``, torchmetrics ``Metric`` classes (exact under DDP) around it."""

from units_lightning.metrics.auroc import DetectionAUROC
from units_lightning.metrics.calibration import ExpectedCalibrationError
from units_lightning.metrics.risk_coverage import RiskCoverage
from units_lightning.metrics.shift import ShiftMetrics
from units_lightning.metrics.task_mean import TaskMean
from units_lightning.metrics.theorem_one import TheoremOneCheck
from units_lightning.metrics.uncertainty import UncertaintyMetrics
from units_lightning.metrics.vacuity_threshold import VacuityThresholdAccuracy

__all__ = [
    "DetectionAUROC",
    "ExpectedCalibrationError",
    "RiskCoverage",
    "ShiftMetrics",
    "TaskMean",
    "TheoremOneCheck",
    "UncertaintyMetrics",
    "VacuityThresholdAccuracy",
]

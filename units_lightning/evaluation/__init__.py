"""Test-time evaluation: out-of-distribution query shifts, checkpoint ensembles, reports and prediction files."""

from units_lightning.evaluation.ensemble import CheckpointEnsemble, RankedCheckpoint, checkpoint_score
from units_lightning.evaluation.prediction_writer import PredictionWriter
from units_lightning.evaluation.report import write_report
from units_lightning.evaluation.shifts import ForeignQueries, QueryShift, Rotation, Scale, match_image_shape

__all__ = [
    "CheckpointEnsemble",
    "ForeignQueries",
    "PredictionWriter",
    "QueryShift",
    "RankedCheckpoint",
    "Rotation",
    "Scale",
    "checkpoint_score",
    "match_image_shape",
    "write_report",
]

"""Test-time evaluation: out-of-distribution query shifts, checkpoint ensembles, and the test results."""

from units_lightning.evaluation.ensemble import CheckpointEnsemble, RankedCheckpoint, checkpoint_score
from units_lightning.evaluation.results import write_results
from units_lightning.evaluation.shifts import ForeignQueries, QueryShift, Rotation, Scale, match_image_shape

__all__ = [
    "CheckpointEnsemble",
    "ForeignQueries",
    "QueryShift",
    "RankedCheckpoint",
    "Rotation",
    "Scale",
    "checkpoint_score",
    "match_image_shape",
    "write_results",
]

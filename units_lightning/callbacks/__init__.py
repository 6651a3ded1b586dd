"""Every callback of the package, one per file, each working with any logger.

The belief dashboard (``ScheduleMonitor``, ``TheoremOneMonitor``, ``SelectionMonitor``, ``UncertaintyCurves``)
reads the typed step outputs of ``units_lightning.outputs``; the run's files are written by ``SaveRunConfig``
(``config.yaml``), ``SummaryWriter`` (``summary.json`` after ``fit``), ``ResultsWriter`` (``results.json`` after
``test``; ``UnitsMAML`` adds one to every trainer) and ``PredictionWriter`` (``predictions.csv`` after ``predict``).
``CSVHistory`` keeps a ``CSVLogger``'s ``metrics.csv`` of each fit segment, which a resumed fit would delete.
``UnitsMAML`` also adds ``LabelBudget`` (the label ledger over a fit) and ``CheckpointOnSigterm`` (``last.ckpt`` at the
step SIGTERM arrives) to every trainer.

``MilestoneCheckpoint`` saves a checkpoint at given counts of labeled query sets (the label-budget configs: 4,000,
8,000 and 10,000), so that one run gives every point of a label-budget table.

``ValidationProgress`` is the quiet progress display of the ``units-lightning`` command: one line per validation.

``CollapseMonitor`` warns when training sits at chance with vacuity near 0 or 1 (a diverged run); the
``units-lightning`` command adds one to every run, configured by ``--collapse.window`` and friends.

``dashboard_callbacks()`` returns one of each dashboard callback; the ``units-lightning`` command adds them to
every run (``--dashboard_callbacks false`` leaves them out). From Python::

    trainer = pl.Trainer(callbacks=dashboard_callbacks(), inference_mode=False)
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from units_lightning.callbacks.collapse_monitor import CollapseMonitor, TrainingCollapseWarning
from units_lightning.callbacks.csv_history import CSVHistory
from units_lightning.callbacks.label_budget import LabelBudget
from units_lightning.callbacks.milestone_checkpoint import MilestoneCheckpoint
from units_lightning.callbacks.non_finite import NonFiniteGuard
from units_lightning.callbacks.prediction_writer import PredictionWriter
from units_lightning.callbacks.progress import ValidationProgress
from units_lightning.callbacks.results_writer import ResultsWriter
from units_lightning.callbacks.save_config import SaveRunConfig
from units_lightning.callbacks.schedule_monitor import ScheduleMonitor
from units_lightning.callbacks.selection_monitor import SelectionMonitor
from units_lightning.callbacks.sigterm import CheckpointOnSigterm
from units_lightning.callbacks.summary_writer import SummaryWriter
from units_lightning.callbacks.theorem_one import TheoremOneMonitor
from units_lightning.callbacks.uncertainty_curves import UncertaintyCurves

__all__ = [
    "CSVHistory",
    "CheckpointOnSigterm",
    "CollapseMonitor",
    "LabelBudget",
    "MilestoneCheckpoint",
    "NonFiniteGuard",
    "PredictionWriter",
    "ResultsWriter",
    "SaveRunConfig",
    "ScheduleMonitor",
    "SelectionMonitor",
    "SummaryWriter",
    "TheoremOneMonitor",
    "TrainingCollapseWarning",
    "UncertaintyCurves",
    "ValidationProgress",
    "dashboard_callbacks",
]


def dashboard_callbacks() -> list[Callback]:
    """Fresh instances of the dashboard callbacks: schedules, Theorem 1, selection and uncertainty curves."""
    return [ScheduleMonitor(), TheoremOneMonitor(), SelectionMonitor(), UncertaintyCurves()]

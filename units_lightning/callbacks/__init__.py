"""Callbacks that turn a run into the belief dashboard: one callback per file, each working with any logger.

``dashboard_callbacks()`` returns one of each; the ``units-lightning`` command adds them to every run
(``--dashboard_callbacks false`` leaves them out). From Python::

    trainer = pl.Trainer(callbacks=dashboard_callbacks(), inference_mode=False)
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from units_lightning.callbacks.save_config import SaveRunConfig
from units_lightning.callbacks.schedule_monitor import ScheduleMonitor
from units_lightning.callbacks.selection_monitor import SelectionMonitor
from units_lightning.callbacks.theorem_one import TheoremOneMonitor, theorem_one_margin
from units_lightning.callbacks.uncertainty_curves import DEFAULT_VACUITY_THRESHOLDS, UncertaintyCurves

__all__ = [
    "DEFAULT_VACUITY_THRESHOLDS",
    "SaveRunConfig",
    "ScheduleMonitor",
    "SelectionMonitor",
    "TheoremOneMonitor",
    "UncertaintyCurves",
    "dashboard_callbacks",
    "theorem_one_margin",
]


def dashboard_callbacks() -> list[Callback]:
    """Fresh instances of the dashboard callbacks: schedules, Theorem 1, selection and uncertainty curves."""
    return [ScheduleMonitor(), TheoremOneMonitor(), SelectionMonitor(), UncertaintyCurves()]

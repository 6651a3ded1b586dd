"""The belief dashboard as data: which charts, over which logged keys. The W&B workspace (``workspace.py``) and
the offline report (``report.py``) both draw from this one list, so the two views cannot drift apart. The keys
are those of ``units_lightning.keys``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from units_lightning import keys
from units_lightning.keys import TRAIN, VAL, VAL_CURVE, stage_key

__all__ = ["CHARTS", "STEP", "EPOCH", "Chart", "charts"]

STEP = "step"  # the trainer's global step (W&B: trainer/global_step)
EPOCH = "epoch"


@dataclass(frozen=True)
class Chart:
    """One chart of the dashboard.

    Attributes:
        section: the group it belongs to (a W&B workspace section, a heading of the report).
        title: what it shows.
        y: the logged keys drawn as lines.
        x: ``STEP``, ``EPOCH`` or a logged key (then only rows holding both x and y count).
        y_pattern: a regular expression for series whose number depends on the run (one per query-set slot).
        kind: ``"line"``; ``"histogram"`` (W&B histograms over time: the workspace only, the report draws the
            quantiles of the same values); ``"threshold_curve"`` (the ``val_curve`` keys drawn against their
            threshold, one line per validation).
        y_label: label of the y axis.
        y_range: fixed y-axis range, ``None`` for automatic ends.
    """

    section: str
    title: str
    y: tuple[str, ...] = ()
    x: str = STEP
    y_pattern: str | None = None
    kind: Literal["line", "histogram", "threshold_curve"] = "line"
    y_label: str = ""
    y_range: tuple[float | None, float | None] = field(default=(None, None))

    def matching(self, keys: Iterable[str]) -> list[str]:
        """The keys this chart draws among ``keys``: its ``y`` keys present, plus those matching ``y_pattern``."""
        keys = set(keys)
        found = [key for key in self.y if key in keys]
        if self.y_pattern is not None:
            pattern = re.compile(self.y_pattern)
            found += sorted((key for key in keys if pattern.fullmatch(key)), key=_natural)
        return found


def _natural(key: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key))


def charts(thresholds: Iterable[float] = keys.CURVE_VACUITY_THRESHOLDS) -> tuple[Chart, ...]:
    """The dashboard's charts, for the vacuity thresholds ``UncertaintyCurves`` logs."""
    thresholds = sorted(thresholds)
    accuracy = tuple(stage_key(VAL_CURVE, keys.acc_vacuity_below(t)) for t in thresholds)
    coverage = tuple(stage_key(VAL_CURVE, keys.coverage_vacuity_below(t)) for t in thresholds)
    belief_range = (0.0, 1.0)
    sides = ("chosen", "rejected")
    return (
        Chart(
            "Belief trends",
            "Training beliefs per epoch (Figure 3a)",
            tuple(keys.epoch_key(stage_key(TRAIN, b)) for b in keys.BELIEFS),
            x=EPOCH,
            y_label="mean over labeled query sets",
            y_range=belief_range,
        ),
        Chart(
            "Belief trends",
            "Validation beliefs per epoch (Figure 3b)",
            tuple(stage_key(VAL, b) for b in keys.BELIEFS),
            x=EPOCH,
            y_label="mean over validation tasks",
            y_range=belief_range,
        ),
        Chart(
            "Belief trends",
            "Tasks where Theorem 1 holds (ib >= cb / 2)",
            (keys.theorem1_holds(TRAIN), keys.theorem1_holds(VAL)),
            x=EPOCH,
            y_label="fraction of tasks (must be 1)",
            y_range=(0.0, 1.05),
        ),
        Chart(
            "Belief trends",
            "Theorem 1 slack: min over tasks of ib - cb / 2",
            (keys.theorem1_margin(TRAIN), keys.theorem1_margin(VAL)),
            x=EPOCH,
            y_label="ib - cb / 2 (>= 0 where it holds)",
        ),
        Chart(
            "Belief trends",
            "Accuracy",
            (keys.epoch_key(stage_key(TRAIN, keys.ACC)), stage_key(VAL, keys.ACC)),
            x=EPOCH,
            y_label="accuracy",
            y_range=(0.0, 1.0),
        ),
        Chart("Schedules", "lambda: weight of vacuity in the task score", (keys.SCHEDULE_LAMBDA,), y_label="lambda"),
        Chart("Schedules", "eta: weight of the incorrect-belief regulariser", (keys.SCHEDULE_ETA,), y_label="eta"),
        Chart(
            "Selection",
            "Task uncertainty of chosen vs rejected query sets (step means)",
            tuple(keys.step_key(keys.selection_uncertainty(side)) for side in sides),
            y_label="task uncertainty",
        ),
        Chart(
            "Selection",
            "Task uncertainty quantiles, chosen vs rejected (per epoch)",
            tuple(keys.selection_quantile(side, q) for side in sides for q in (10, 50, 90)),
            x=EPOCH,
            y_label="task uncertainty",
        ),
        Chart(
            "Selection",
            "Task uncertainty of chosen query sets (histograms)",
            (keys.selection_histogram("chosen"),),
            kind="histogram",
        ),
        Chart(
            "Selection",
            "Task uncertainty of rejected query sets (histograms)",
            (keys.selection_histogram("rejected"),),
            kind="histogram",
        ),
        Chart(
            "Selection",
            "How often each query-set slot is labeled",
            y_pattern=keys.SLOT_WIN_PATTERN,
            x=EPOCH,
            y_label="fraction of tasks",
            y_range=(0.0, 1.0),
        ),
        Chart(
            "Label budget",
            "Validation accuracy vs labeled query sets (label-budget curve)",
            (stage_key(VAL, keys.ACC),),
            x=keys.LABEL_BUDGET_QUERY_SETS,
            y_label="validation accuracy",
            y_range=(0.0, 1.0),
        ),
        Chart(
            "Label budget",
            "Labels spent",
            (keys.LABELS_QUERY_SETS, keys.LABELS_QUERY_IMAGES, keys.LABELS_SUPPORT_IMAGES),
            y_label="labels",
        ),
        Chart(
            "Uncertainty curves",
            "Validation accuracy vs vacuity threshold (one line per validation)",
            accuracy,
            kind="threshold_curve",
            y_label="accuracy of queries with vacuity < t",
            y_range=(0.0, 1.0),
        ),
        Chart(
            "Uncertainty curves",
            "Coverage vs vacuity threshold (one line per validation)",
            coverage,
            kind="threshold_curve",
            y_label="fraction of queries with vacuity < t",
            y_range=(0.0, 1.0),
        ),
    )


CHARTS = charts()

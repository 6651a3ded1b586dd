"""The belief dashboard as data: which charts, over which logged keys. The W&B workspace (``dashboard.py``) and
the offline ``report`` both draw from this one list, so the two views cannot drift apart."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from units_lightning.callbacks._shared import threshold_key
from units_lightning.callbacks.uncertainty_curves import DEFAULT_VACUITY_THRESHOLDS

__all__ = ["CHARTS", "STEP", "EPOCH", "Chart", "charts", "threshold_from_key"]

STEP = "step"  # the trainer's global step (W&B: trainer/global_step)
EPOCH = "epoch"

_BELIEFS = ("vacuity", "dissonance", "incorrect_belief", "correct_belief")
_THRESHOLD_KEY = re.compile(r"_at_vacuity_(\d+)p(\d+)$")


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


def threshold_from_key(key: str) -> float:
    """``val_curve/acc_at_vacuity_0p20`` -> 0.2."""
    match = _THRESHOLD_KEY.search(key)
    if match is None:
        raise ValueError(f"{key!r} names no vacuity threshold")
    return float(f"{match.group(1)}.{match.group(2)}")


def charts(thresholds: Iterable[float] = DEFAULT_VACUITY_THRESHOLDS) -> tuple[Chart, ...]:
    """The dashboard's charts, for the vacuity thresholds ``UncertaintyCurves`` logs."""
    suffixes = [threshold_key(t) for t in sorted(thresholds)]
    accuracy = tuple(f"val_curve/acc_at_vacuity_{s}" for s in suffixes)
    coverage = tuple(f"val_curve/coverage_at_vacuity_{s}" for s in suffixes)
    belief_range = (0.0, 1.0)
    return (
        Chart(
            "Belief trends",
            "Training beliefs per epoch (Figure 3a)",
            tuple(f"train/{b}_epoch" for b in _BELIEFS),
            x=EPOCH,
            y_label="mean over labeled query sets",
            y_range=belief_range,
        ),
        Chart(
            "Belief trends",
            "Validation beliefs per epoch (Figure 3b)",
            tuple(f"val/{b}" for b in _BELIEFS),
            x=EPOCH,
            y_label="mean over validation tasks",
            y_range=belief_range,
        ),
        Chart(
            "Belief trends",
            "Tasks where Theorem 1 holds (ib >= cb / 2)",
            ("train/theorem1_holds", "val/theorem1_holds"),
            x=EPOCH,
            y_label="fraction of tasks (must be 1)",
            y_range=(0.0, 1.05),
        ),
        Chart(
            "Belief trends",
            "Theorem 1 slack: min over tasks of ib - cb / 2",
            ("train/theorem1_margin", "val/theorem1_margin"),
            x=EPOCH,
            y_label="ib - cb / 2 (>= 0 where it holds)",
        ),
        Chart(
            "Belief trends", "Accuracy", ("train/acc_epoch", "val/acc"), x=EPOCH, y_label="accuracy", y_range=(0.0, 1.0)
        ),
        Chart("Schedules", "lambda: weight of vacuity in the task score", ("schedule/lambda",), y_label="lambda"),
        Chart("Schedules", "eta: weight of the incorrect-belief regulariser", ("schedule/eta",), y_label="eta"),
        Chart(
            "Selection",
            "Task uncertainty of chosen vs rejected query sets (step means)",
            ("selection/uncertainty_chosen_step", "selection/uncertainty_rejected_step"),
            y_label="task uncertainty",
        ),
        Chart(
            "Selection",
            "Task uncertainty quantiles, chosen vs rejected (per epoch)",
            tuple(f"selection/uncertainty_{w}_p{q}" for w in ("chosen", "rejected") for q in (10, 50, 90)),
            x=EPOCH,
            y_label="task uncertainty",
        ),
        Chart(
            "Selection",
            "Task uncertainty of chosen query sets (histograms)",
            ("selection/uncertainty_chosen_hist",),
            kind="histogram",
        ),
        Chart(
            "Selection",
            "Task uncertainty of rejected query sets (histograms)",
            ("selection/uncertainty_rejected_hist",),
            kind="histogram",
        ),
        Chart(
            "Selection",
            "How often each query-set slot is labeled",
            y_pattern=r"selection/slot_win/\d+",
            x=EPOCH,
            y_label="fraction of tasks",
            y_range=(0.0, 1.0),
        ),
        Chart(
            "Label budget",
            "Validation accuracy vs labeled query sets (label-budget curve)",
            ("val/acc",),
            x="label_budget/query_sets",
            y_label="validation accuracy",
            y_range=(0.0, 1.0),
        ),
        Chart(
            "Label budget",
            "Labels spent",
            ("labels/query_sets", "labels/query_images", "labels/support_images"),
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

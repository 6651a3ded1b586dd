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

__all__ = ["CHARTS", "STEP", "EPOCH", "Chart", "charts", "series_label"]

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
        y_range: fixed y-axis range, ``None`` for automatic ends, in the logged values' units.
        about: one sentence under the chart in the report: what it shows, in words.
        percent: the values are fractions (accuracy, coverage) that the report draws in % (as its tables show
            them); W&B panels show them as logged.
        chance: the values are accuracies: the report draws the chance line, 1 / N for N-way tasks.
    """

    section: str
    title: str
    y: tuple[str, ...] = ()
    x: str = STEP
    y_pattern: str | None = None
    kind: Literal["line", "histogram", "threshold_curve"] = "line"
    y_label: str = ""
    y_range: tuple[float | None, float | None] = field(default=(None, None))
    about: str = ""
    percent: bool = False
    chance: bool = False

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


_STAGE_WORDS = {"train": "train", "val": "validation", "test": "test", "val_curve": "validation"}
_NAME_WORDS = {"acc": "accuracy", "loss": "loss", "query_sets": "query sets", "query_images": "query images"}
_QUANTILE_WORDS = {"10": "10th percentile", "50": "median", "90": "90th percentile"}


def series_label(key: str) -> str:
    """A logged key in words, for a legend.

    >>> series_label("train/incorrect_belief_epoch"), series_label("val/acc"), series_label("schedule/eta")
    ('train incorrect belief', 'validation accuracy', 'eta')
    >>> series_label("selection/uncertainty_rejected_p90"), series_label("selection/slot_win/2")
    ('rejected, 90th percentile', 'query-set slot 2')
    >>> series_label("selection/uncertainty_chosen_hist")
    'chosen'
    """
    prefix, _, name = key.partition("/")
    name = re.sub(r"_(epoch|step)$", "", name)
    if prefix == "selection":
        slot = re.fullmatch(r"slot_win/(\d+)", name)
        if slot:
            return f"query-set slot {slot.group(1)}"
        quantile = re.fullmatch(r"uncertainty_(chosen|rejected)_p(\d+)", name)
        if quantile:
            return f"{quantile.group(1)}, {_QUANTILE_WORDS.get(quantile.group(2), 'p' + quantile.group(2))}"
        histogram = re.fullmatch(r"uncertainty_(chosen|rejected)_hist", name)
        if histogram:
            return histogram.group(1)
        return name.removeprefix("uncertainty_").replace("_", " ")
    if prefix in ("schedule", "labels", "label_budget"):
        return _NAME_WORDS.get(name, name.replace("_", " "))
    words = _NAME_WORDS.get(name, name.replace("_", " ").replace("theorem1 ", "Theorem 1 "))
    return f"{_STAGE_WORDS.get(prefix, prefix)} {words}".strip()


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
            about="Vacuity (lack of evidence), dissonance (conflicting belief between classes), incorrect and "
            "correct belief of the labeled query sets, averaged over each epoch.",
        ),
        Chart(
            "Belief trends",
            "Validation beliefs per epoch (Figure 3b)",
            tuple(stage_key(VAL, b) for b in keys.BELIEFS),
            x=EPOCH,
            y_label="mean over validation tasks",
            y_range=belief_range,
            about="The same four beliefs on the fixed validation tasks, at each validation.",
        ),
        Chart(
            "Belief trends",
            "Tasks where Theorem 1 holds: incorrect belief >= dissonance / 2",
            (keys.theorem1_holds(TRAIN), keys.theorem1_holds(VAL)),
            x=EPOCH,
            y_label="fraction of tasks (must be 1)",
            y_range=(0.0, 1.05),
            about="Theorem 1 of the paper: a query's incorrect belief is at least half its dissonance. It must hold "
            "for every task: anything below 1 is a bug.",
        ),
        Chart(
            "Belief trends",
            "Theorem 1 slack: smallest (incorrect belief - dissonance / 2) over tasks",
            (keys.theorem1_margin(TRAIN), keys.theorem1_margin(VAL)),
            x=EPOCH,
            y_label="incorrect belief - dissonance / 2",
            about="How far the tightest task is from breaking Theorem 1 (0 or more where it holds).",
        ),
        Chart(
            "Belief trends",
            "Accuracy",
            (keys.epoch_key(stage_key(TRAIN, keys.ACC)), stage_key(VAL, keys.ACC)),
            x=EPOCH,
            y_label="accuracy",
            y_range=(0.0, 1.0),
            about="Training accuracy on the labeled query sets and validation accuracy, per epoch.",
            percent=True,
            chance=True,
        ),
        Chart(
            "Schedules",
            "lambda: weight of vacuity in the task score",
            (keys.SCHEDULE_LAMBDA,),
            y_label="lambda",
            about="Task uncertainty = lambda x mean vacuity + (1 - lambda) x mean dissonance.",
        ),
        Chart(
            "Schedules",
            "eta: weight of the incorrect-belief regulariser",
            (keys.SCHEDULE_ETA,),
            y_label="eta",
            about="The loss is log S - log alpha_y + eta x incorrect belief.",
        ),
        Chart(
            "Selection",
            "Task uncertainty of chosen vs rejected query sets (step means)",
            tuple(keys.step_key(keys.selection_uncertainty(side)) for side in sides),
            y_label="task uncertainty",
            about="Units-ML labels the most uncertain query set of each task: chosen sets should sit above rejected "
            "ones once selection starts (after the sampler's warm-up).",
        ),
        Chart(
            "Selection",
            "Task uncertainty quantiles, chosen vs rejected (per epoch)",
            tuple(keys.selection_quantile(side, q) for side in sides for q in (10, 50, 90)),
            x=EPOCH,
            y_label="task uncertainty",
            about="10th, 50th and 90th percentiles of the task uncertainty of chosen and rejected query sets.",
        ),
        *(
            Chart(
                "Selection",
                f"Task uncertainty of {side} query sets (histograms)",
                (keys.selection_histogram(side),),
                kind="histogram",
                about=f"The distribution of the {side} sets' task uncertainty in the latest epoch (W&B runs).",
            )
            for side in sides
        ),
        Chart(
            "Selection",
            "How often each query-set slot is labeled",
            y_pattern=keys.SLOT_WIN_PATTERN,
            x=EPOCH,
            y_label="fraction of tasks",
            y_range=(0.0, 1.0),
            about="Query sets are drawn alike, so each slot should win about equally often.",
        ),
        Chart(
            "Label budget",
            "Validation accuracy vs labeled query sets (label-budget curve)",
            (stage_key(VAL, keys.ACC),),
            x=keys.LABEL_BUDGET_QUERY_SETS,
            y_label="validation accuracy",
            y_range=(0.0, 1.0),
            about="Accuracy bought by each label: the curve a label-efficient method should lift.",
            percent=True,
            chance=True,
        ),
        Chart(
            "Label budget",
            "Labels spent",
            (keys.LABELS_QUERY_SETS, keys.LABELS_QUERY_IMAGES, keys.LABELS_SUPPORT_IMAGES),
            y_label="labels",
            about="Labeled query sets, query images and support images so far (LabelLedger).",
        ),
        Chart(
            "Uncertainty curves",
            "Validation accuracy vs vacuity threshold (one line per validation)",
            accuracy,
            kind="threshold_curve",
            y_label="accuracy of queries with vacuity < t",
            y_range=(0.0, 1.0),
            about="Accuracy of the queries the model is sure of (vacuity below t); dark purple: the first validation, "
            "thick yellow: the latest.",
            percent=True,
            chance=True,
        ),
        Chart(
            "Uncertainty curves",
            "Coverage vs vacuity threshold (one line per validation)",
            coverage,
            kind="threshold_curve",
            y_label="share of queries with vacuity < t",
            y_range=(0.0, 1.0),
            about="The fraction of queries kept at each threshold (vacuity below t); one line per validation, "
            "coloured as in the accuracy chart.",
            percent=True,
        ),
    )


CHARTS = charts()

"""Every logged name of units-lightning, and the one format of a vacuity threshold inside a name.

The module, the callbacks, the metrics and the dashboard all log or read these names: they are spelled here
once. This module imports nothing from ``units_lightning``, so any part can use it. Namespaces:

* ``train/``: per training step (``_step``) and epoch (``_epoch``), over the labeled query sets: ``loss``,
  ``acc`` and the four ``BELIEFS``; per epoch ``theorem1_holds`` and ``theorem1_margin``.
* ``val/`` and ``test/``: per epoch, over the evaluation tasks: ``loss``, ``acc``, ``BELIEFS``,
  ``theorem1_*`` and the single numbers of ``UncertaintyMetrics``: ``acc_ci95``,
  ``acc_vacuity_below_<t>``, ``coverage_vacuity_below_<t>``, ``selective_acc_<pct>``, ``aurc``,
  ``selective_acc_max_probability_<pct>``, ``aurc_max_probability``, ``ece``.
* ``test/ood/<shift>/<metric>``: accuracy, vacuity and detection AUROC of a shifted query set.
* ``val_curve/``: ``acc_vacuity_below_<t>`` and ``coverage_vacuity_below_<t>`` over the grid
  ``CURVE_VACUITY_THRESHOLDS``, at every validation (``UncertaintyCurves``).
* ``selection/``: task uncertainty of the chosen and rejected query sets (step means, epoch quantiles
  ``_p<q>``, W&B histograms ``_hist``) and ``slot_win/<i>``, how often query-set slot ``i`` is labeled.
* ``labels/``: labels spent so far (``query_sets``, ``query_images``, ``support_images``).
* ``train/skipped_steps``: optimizer steps skipped so far because their loss or gradients were not finite.
* ``label_budget/query_sets``: labeled query sets, logged in the row of each validation.
* ``schedule/``: ``lambda`` and ``eta`` as used by each training step.

A threshold ``t`` is written with two decimals and ``p`` for the dot (``0p20`` for 0.2): W&B reads a dot in a
key as nesting. ``results.json`` keeps thresholds as numbers.

Example:
    >>> stage_key(VAL, acc_vacuity_below(0.2)), stage_key(VAL_CURVE, coverage_vacuity_below(1.0))
    ('val/acc_vacuity_below_0p20', 'val_curve/coverage_vacuity_below_1p00')
    >>> threshold_from_key("test/acc_vacuity_below_0p20")
    0.2
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "ACC",
    "ACC_CI95",
    "AURC",
    "AURC_MAX_PROBABILITY",
    "BELIEFS",
    "CURVE_VACUITY_THRESHOLDS",
    "ECE",
    "LABELS_QUERY_IMAGES",
    "LABELS_QUERY_SETS",
    "LABELS_SUPPORT_IMAGES",
    "LABEL_BUDGET_QUERY_SETS",
    "LOSS",
    "REPORTED_VACUITY_THRESHOLDS",
    "SCHEDULE_ETA",
    "SCHEDULE_LAMBDA",
    "SLOT_WIN_PATTERN",
    "STAGES",
    "TEST",
    "TRAIN",
    "TRAIN_SKIPPED_STEPS",
    "VAL",
    "VAL_CURVE",
    "acc_vacuity_below",
    "coverage_vacuity_below",
    "epoch_key",
    "ood_key",
    "selection_histogram",
    "selection_quantile",
    "selection_uncertainty",
    "selective_acc",
    "selective_acc_max_probability",
    "slot_win",
    "stage_key",
    "step_key",
    "theorem1_holds",
    "theorem1_margin",
    "threshold_from_key",
    "threshold_suffix",
]

# --- thresholds ---------------------------------------------------------------------------------------------

REPORTED_VACUITY_THRESHOLDS = (0.1, 0.2)
"""Thresholds reported as single numbers at validation and test (the paper's "Units-ML 0.1 / 0.2" rows)."""
CURVE_VACUITY_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""The grid of the validation curve ``val_curve/`` (``UncertaintyCurves``, the dashboard's curve charts)."""

_THRESHOLD_SUFFIX = re.compile(r"_(\d+)p(\d\d)$")


def threshold_suffix(threshold: float) -> str:
    """A threshold as a name suffix without a dot (W&B reads dots as nesting).

    Example:
        >>> threshold_suffix(0.2), threshold_suffix(1.0), threshold_suffix(0.05)
        ('0p20', '1p00', '0p05')
    """
    return f"{threshold:.2f}".replace(".", "p")


def threshold_from_key(key: str) -> float:
    """The threshold a key ends with: the inverse of ``threshold_suffix``.

    Example:
        >>> threshold_from_key("val_curve/acc_vacuity_below_0p20")
        0.2

    Raises:
        ValueError: if ``key`` does not end with a threshold suffix.
    """
    match = _THRESHOLD_SUFFIX.search(key)
    if match is None:
        raise ValueError(f"{key!r} names no vacuity threshold")
    return float(f"{match.group(1)}.{match.group(2)}")


# --- stages and the names logged under each ------------------------------------------------------------------

TRAIN, VAL, TEST = "train", "val", "test"
STAGES = (TRAIN, VAL, TEST)
VAL_CURVE = "val_curve"
"""Namespace of the validation curve: the ``val`` quantities over ``CURVE_VACUITY_THRESHOLDS``."""

LOSS = "loss"
ACC = "acc"
BELIEFS = ("vacuity", "dissonance", "incorrect_belief", "correct_belief")
"""Per-query beliefs averaged over tasks (the paper's vacuous, conflicting, incorrect and correct belief)."""
ACC_CI95 = "acc_ci95"
AURC = "aurc"
"""Area under the risk-coverage curve, queries ranked by vacuity."""
AURC_MAX_PROBABILITY = "aurc_max_probability"
"""The same, queries ranked by their largest expected class probability (the baseline any classifier has)."""
ECE = "ece"


def stage_key(stage: str, name: str) -> str:
    """``name`` in the namespace ``stage``: ``stage_key("val", "acc")`` is ``"val/acc"``."""
    return f"{stage}/{name}"


def epoch_key(key: str) -> str:
    """The epoch mean Lightning logs for a key logged both per step and per epoch: ``train/acc_epoch``."""
    return f"{key}_epoch"


def step_key(key: str) -> str:
    """The per-step value Lightning logs for a key logged both per step and per epoch: ``train/acc_step``."""
    return f"{key}_step"


def acc_vacuity_below(threshold: float) -> str:
    """Accuracy of the queries with vacuity below ``threshold``: ``acc_vacuity_below_0p20``."""
    return f"acc_vacuity_below_{threshold_suffix(threshold)}"


def coverage_vacuity_below(threshold: float) -> str:
    """Fraction of the queries with vacuity below ``threshold``: ``coverage_vacuity_below_0p20``."""
    return f"coverage_vacuity_below_{threshold_suffix(threshold)}"


def selective_acc(coverage: float) -> str:
    """Accuracy of the ``coverage`` most confident queries, in percent: ``selective_acc(0.7)`` is
    ``"selective_acc_70"``."""
    return f"selective_acc_{round(100 * coverage)}"


def selective_acc_max_probability(coverage: float) -> str:
    """``selective_acc`` with the queries ranked by their largest expected class probability instead of vacuity:
    ``"selective_acc_max_probability_70"``."""
    return f"selective_acc_max_probability_{round(100 * coverage)}"


def theorem1_holds(stage: str) -> str:
    """Fraction of the stage's tasks where Theorem 1 holds: ``val/theorem1_holds``."""
    return stage_key(stage, "theorem1_holds")


def theorem1_margin(stage: str) -> str:
    """Smallest slack of Theorem 1 over the stage's tasks: ``val/theorem1_margin``."""
    return stage_key(stage, "theorem1_margin")


def ood_key(shift: str, metric: str) -> str:
    """A test metric (``acc``, ``vacuity``, ``auroc``) of a shifted query set: ``test/ood/rotation_30/auroc``."""
    return f"{TEST}/ood/{shift}/{metric}"


# --- selection, labels, schedules ----------------------------------------------------------------------------

_Which = Literal["chosen", "rejected"]


def selection_uncertainty(which: _Which) -> str:
    """Step mean of the task uncertainty of the chosen or rejected query sets: ``selection/uncertainty_chosen``."""
    return f"selection/uncertainty_{which}"


def selection_quantile(which: _Which, percent: int) -> str:
    """An epoch quantile of that uncertainty, in percent: ``selection/uncertainty_chosen_p10``."""
    return f"{selection_uncertainty(which)}_p{percent}"


def selection_histogram(which: _Which) -> str:
    """The W&B histogram of that uncertainty over an epoch: ``selection/uncertainty_chosen_hist``."""
    return f"{selection_uncertainty(which)}_hist"


def slot_win(slot: int) -> str:
    """Fraction of an epoch's tasks whose query set in ``slot`` was labeled: ``selection/slot_win/0``."""
    return f"selection/slot_win/{slot}"


SLOT_WIN_PATTERN = r"selection/slot_win/\d+"
"""Regular expression of every ``slot_win`` key (their number depends on the sampler)."""

LABELS_QUERY_SETS = "labels/query_sets"
LABELS_QUERY_IMAGES = "labels/query_images"
LABELS_SUPPORT_IMAGES = "labels/support_images"
LABEL_BUDGET_QUERY_SETS = "label_budget/query_sets"
"""Labeled query sets at a validation, in the row of ``val/acc`` (the label-budget curve)."""
TRAIN_SKIPPED_STEPS = "train/skipped_steps"
"""Optimizer steps skipped so far (non-finite loss or gradients, ``model.non_finite: skip``), logged every step."""
SCHEDULE_LAMBDA = "schedule/lambda"
SCHEDULE_ETA = "schedule/eta"

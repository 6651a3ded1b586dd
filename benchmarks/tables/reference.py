"""The paper's numbers that the tables stand beside: the label-budget accuracies at each budget point, the standard
setting's, and notes on data that make a comparison unfair."""

from __future__ import annotations

PAPER_SOURCE = (
    "Pandey & Yu, Multidimensional Belief Quantification for Label-Efficient Meta-Learning, CVPR 2022: "
    "Table 2 and the limited-label-budget tables, as collected in ../shared/REFERENCE.md section 4"
)
BUDGET_POINTS = (4000, 8000, 10000)
"""Labeled query sets after which the paper reports test accuracy in the label-budget setting."""
BUDGET_METHODS = ("MAML", "Units-NTS", "Units-ML")
"""The methods of the paper's label-budget tables, in the order of ``PAPER_BUDGET``'s rows."""


def _by_method(*rows: tuple[float, float, float]) -> dict[str, tuple[float, float, float]]:
    return dict(zip(BUDGET_METHODS, rows, strict=True))


PAPER_BUDGET: dict[str, dict[str, tuple[float, float, float]]] = {  # MAML, Units-NTS, Units-ML
    "budget_omniglot_5w1s": _by_method((73.44, 80.18, 85.56), (92.38, 96.13, 96.98), (95.00, 97.90, 98.23)),
    "budget_omniglot_5w5s": _by_method((92.00, 96.26, 96.38), (98.13, 98.43, 98.46), (98.86, 99.23, 99.16)),
    "budget_omniglot_20w1s": _by_method((65.24, 72.41, 73.91), (73.35, 75.88, 83.56), (79.17, 78.60, 83.45)),
    "budget_omniglot_20w5s": _by_method((86.62, 89.75, 88.26), (91.32, 94.05, 95.66), (93.20, 94.16, 96.61)),
    "budget_cifarfs_5w5s": _by_method((29.72, 30.14, 29.95), (53.87, 58.37, 61.30), (55.88, 60.53, 61.39)),
}
"""Test accuracy (%) after each of ``BUDGET_POINTS`` labeled query sets, by config and method."""
PAPER_STANDARD: dict[str, dict[str, float | None]] = {
    "omniglot_20w1s": {"Units-NTS": 91.96, "Units-ML": 93.17, "vacuity<0.2": 96.83, "vacuity<0.1": 98.85},
    "omniglot_20w5s": {"Units-NTS": 97.38, "Units-ML": 97.72, "vacuity<0.2": 99.04, "vacuity<0.1": 99.42},
    "omniglot_5w1s": {"Units-NTS": 99.20, "Units-ML": 99.59, "vacuity<0.2": None, "vacuity<0.1": None},
    "omniglot_5w5s": {"Units-NTS": 99.66, "Units-ML": 99.83, "vacuity<0.2": None, "vacuity<0.1": None},
    "miniimagenet_5w1s": {"Units-NTS": 51.38, "Units-ML": 50.86, "vacuity<0.2": 61.25, "vacuity<0.1": 82.26},
    "miniimagenet_5w5s": {"Units-NTS": 66.75, "Units-ML": 68.16, "vacuity<0.2": 80.70, "vacuity<0.1": 91.07},
    "cifarfs_5w1s": {"Units-NTS": 59.80, "Units-ML": 59.84, "vacuity<0.2": 76.62, "vacuity<0.1": 87.92},
    "cifarfs_5w5s": {"Units-NTS": 76.15, "Units-ML": 76.69, "vacuity<0.2": 83.54, "vacuity<0.1": 90.46},
}
"""Standard setting, test accuracy (%): Units-NTS, Units-ML, and Units-ML on the queries of vacuity < 0.2 / < 0.1
(None where the paper reports none)."""
VACUITY_THRESHOLDS = (0.2, 0.1)
NOT_COMPARABLE = {
    "miniimagenet": "the mini-ImageNet copy in ../shared/data is a subset (100 train images per class, 200 per "
    "validation and test class, against 600 in the paper's data): numbers from runs on it are not comparable with "
    "the paper's",
}
"""Config-name prefix -> a note printed under its table."""

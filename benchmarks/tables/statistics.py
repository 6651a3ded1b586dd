"""Confidence intervals over seeds: Student's t in closed form (no SciPy), a mean with its 95% interval, and the
seed-by-seed difference of two methods."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def student_t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (integer >= 1) degrees of freedom, in closed form.

    Abramowitz & Stegun 26.7.3 (odd ``df``) and 26.7.4 (even ``df``), with ``theta = atan(t / sqrt(df))``.

    Example:
        >>> round(student_t_two_sided(math.tan(0.475 * math.pi), 1), 12)  # df = 1 is the Cauchy distribution
        0.95
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, cos
        for k in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + (2 4)/(3 5) cos^5 + ... up to cos^(df - 2)
            total += term
            term *= cos * cos * (2 * k) / (2 * k + 1)
        return 2.0 / math.pi * (theta + sin * total)
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(df - 2)
        total += term
        term *= cos * cos * (2 * k - 1) / (2 * k)
    return sin * total


def student_t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile (> 0.5) of Student's t with ``df`` degrees of freedom (bisection to 1e-12).

    Example:
        >>> round(student_t_quantile(0.975, 2), 6)  # sqrt(2 * 0.95^2 / (1 - 0.95^2))
        4.302653
    """
    if not 0.5 < probability < 1.0:
        raise ValueError(f"probability must be in (0.5, 1), got {probability}")
    inside = 2.0 * probability - 1.0
    low, high = 0.0, 1.0
    while student_t_two_sided(high, df) < inside:
        low, high = high, 2.0 * high
    while high - low > 1e-12 * max(1.0, high):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if student_t_two_sided(middle, df) < inside else (low, middle)
    return 0.5 * (low + high)


def mean_ci95(values: Sequence[float]) -> dict[str, Any]:
    """Mean, half-width of the 95% confidence interval (Student t, n - 1 degrees of freedom, sample standard
    deviation) and n of ``values``; the half-width is None for fewer than two values.

    Example:
        >>> mean_ci95([1.0, 2.0, 3.0])["ci95"] == round(student_t_quantile(0.975, 2) / math.sqrt(3), 12)
        True
    """
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = math.fsum(values) / n
    if n == 1:
        return {"mean": mean, "ci95": None, "n": 1}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return {"mean": mean, "ci95": round(student_t_quantile(0.975, n - 1) * std / math.sqrt(n), 12), "n": n}


def paired_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """``ours - theirs`` seed by seed, over the seeds both summaries hold, as a summary (mean, 95% CI, n, values,
    seeds). Both methods of a seed start from the same weights, and their episode streams from the same seed, so
    this is a sharper comparison than two intervals side by side.

    Example:
        >>> ours, theirs = {"values": [95.0, 96.0], "seeds": [0, 1]}, {"values": [94.0, 94.5, 90.0], "seeds": [0, 1, 2]}
        >>> d = paired_difference(ours, theirs)
        >>> d["values"], d["seeds"], d["mean"], d["n"]
        ([1.0, 1.5], [0, 1], 1.25, 2)
    """
    by_seed = dict(zip(theirs["seeds"], theirs["values"], strict=True))
    pairs = [
        (seed, v - by_seed[seed]) for seed, v in zip(ours["seeds"], ours["values"], strict=True) if seed in by_seed
    ]
    return summary([d for _, d in pairs], [seed for seed, _ in pairs], None)


def summary(values: Sequence[float], seeds: Sequence[int], paper: float | None) -> dict[str, Any]:
    """``mean_ci95`` of ``values`` with the values, their seeds and the paper's number beside them."""
    return {**mean_ci95(values), "values": list(values), "seeds": list(seeds), "paper": paper}

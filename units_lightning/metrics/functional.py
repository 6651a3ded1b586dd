"""Evaluation maths on plain tensors: thresholded and selective accuracy, risk-coverage, calibration, AUROC.

Pure functions, no state, no Lightning. The ``Metric`` classes of ``units_lightning.metrics`` hold sums and
counts (or concatenated per-query values) and call these. Conventions:

* ``correct``: (n,) bool, whether each query was classified correctly;
* ``uncertainty``: (n,) float, lower means more confident (vacuity, by default); "the top T% most confident"
  are the T% lowest uncertainties;
* a quantity over an empty selection is ``nan`` (no query kept at a threshold has no accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from units_lightning.keys import REPORTED_VACUITY_THRESHOLDS

__all__ = [
    "DEFAULT_COVERAGES",
    "area_under_risk_coverage",
    "auroc",
    "calibration_bins",
    "curve_thresholds",
    "expected_calibration_error",
    "mean_confidence_interval",
    "risk_coverage_curve",
    "selective_accuracies_and_aurc",
    "selective_accuracy",
    "threshold_accuracy",
    "threshold_curve",
]

DEFAULT_COVERAGES = (1.0, 0.7, 0.6, 0.5)
"""Fractions of the most confident queries whose accuracy is reported (selective accuracy)."""


def mean_confidence_interval(total: Tensor, total_squares: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and 95% confidence half-width ``1.96 * std / sqrt(n)`` from a sum, a sum of squares and a count.

    The standard deviation is the sample one (``n - 1`` in the denominator); one value has half-width 0.
    Taking sums makes the result exact under data-parallel reduction.

    Args:
        total: () sum of the values (e.g. per-task accuracies).
        total_squares: () sum of their squares.
        count: () number of values.

    Returns:
        (mean, half_width), both () tensors; ``nan`` for no values.

    Example:
        >>> values = torch.tensor([0.6, 0.8, 1.0])
        >>> mean, half = mean_confidence_interval(values.sum(), (values**2).sum(), torch.tensor(3))
        >>> round(float(mean), 4), round(float(half), 4)
        (0.8, 0.2263)
    """
    n = count.to(torch.float64)
    total, total_squares = total.to(torch.float64), total_squares.to(torch.float64)
    if float(n) == 0:
        return torch.tensor(math.nan), torch.tensor(math.nan)
    mean = total / n
    variance = ((total_squares - n * mean**2) / (n - 1)).clamp_min(0.0) if float(n) > 1 else torch.zeros(())
    return mean.float(), (1.96 * variance.sqrt() / n.sqrt()).float()


def threshold_accuracy(correct: Tensor, uncertainty: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """Accuracy and coverage of the queries whose uncertainty is strictly below ``threshold``.

    Args:
        correct: (n,) bool.
        uncertainty: (n,) e.g. vacuity in (0, 1].
        threshold: keep queries with ``uncertainty < threshold`` (the paper's "vacuity < 0.2").

    Returns:
        (accuracy among the kept, fraction kept); accuracy is ``nan`` when none is kept.

    Example:
        >>> correct = torch.tensor([True, False, True, False])
        >>> vacuity = torch.tensor([0.05, 0.15, 0.25, 0.6])
        >>> [round(float(x), 4) for x in threshold_accuracy(correct, vacuity, 0.2)]
        [0.5, 0.5]
        >>> [round(float(x), 4) for x in threshold_accuracy(correct, vacuity, 0.1)]
        [1.0, 0.25]
    """
    accuracy, coverage = threshold_curve(correct, uncertainty, [threshold])
    return accuracy[0], coverage[0]


def curve_thresholds(extra: Sequence[float] = REPORTED_VACUITY_THRESHOLDS, step: float = 0.05) -> list[float]:
    """A grid ``step, 2 step, ..., 1`` for the whole threshold curve, merged with the ``extra`` thresholds.

    Example:
        >>> curve_thresholds([0.1, 0.33], step=0.25)
        [0.1, 0.25, 0.33, 0.5, 0.75, 1.0]
    """
    grid = {round(step * i, 10) for i in range(1, int(round(1 / step)) + 1)}
    return sorted(grid | {float(t) for t in extra})


def threshold_counts(correct: Tensor, uncertainty: Tensor, thresholds: Tensor) -> tuple[Tensor, Tensor]:
    """How many queries fall below each threshold, and how many of those are correct (sum-reducible counts).

    Args:
        correct: (n,) bool.
        uncertainty: (n,).
        thresholds: (K,).

    Returns:
        (kept, kept_correct), both (K,) int64.
    """
    if correct.shape != uncertainty.shape:
        raise ValueError(f"correct {tuple(correct.shape)} and uncertainty {tuple(uncertainty.shape)} differ in shape")
    below = uncertainty.reshape(1, -1) < thresholds.reshape(-1, 1).to(uncertainty)
    kept = below.sum(dim=1)
    kept_correct = (below & correct.reshape(1, -1).bool()).sum(dim=1)
    return kept, kept_correct


def threshold_curve(
    correct: Tensor, uncertainty: Tensor, thresholds: Sequence[float] | Tensor
) -> tuple[Tensor, Tensor]:
    """Accuracy and coverage at every threshold: the "accuracy vs vacuity threshold" curve.

    Args:
        correct: (n,) bool.
        uncertainty: (n,).
        thresholds: K thresholds; queries with ``uncertainty < threshold`` are kept.

    Returns:
        (accuracy, coverage), both (K,) float; accuracy ``nan`` where nothing is kept.

    Example:
        >>> correct = torch.tensor([True, True, False, False])
        >>> vacuity = torch.tensor([0.05, 0.15, 0.15, 0.6])
        >>> accuracy, coverage = threshold_curve(correct, vacuity, [0.01, 0.1, 0.2, 1.0])
        >>> accuracy
        tensor([   nan, 1.0000, 0.6667, 0.5000])
        >>> coverage
        tensor([0.0000, 0.2500, 0.7500, 1.0000])
    """
    thresholds = torch.as_tensor(thresholds, dtype=torch.float64)
    kept, kept_correct = threshold_counts(correct, uncertainty.to(torch.float64), thresholds)
    return counts_to_curve(kept, kept_correct, torch.tensor(correct.numel()))


def counts_to_curve(kept: Tensor, kept_correct: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """(accuracy, coverage) from the counts of ``threshold_counts`` and the number of queries."""
    kept, kept_correct = kept.to(torch.float64), kept_correct.to(torch.float64)
    accuracy = torch.where(kept > 0, kept_correct / kept.clamp_min(1), torch.nan)
    coverage = kept / total.to(torch.float64).clamp_min(1)
    return accuracy.float(), coverage.float()


def _tie_aware_cumulative_errors(correct: Tensor, uncertainty: Tensor) -> Tensor:
    """Expected number of errors among the k most confident queries, k = 1..n, ties in random order.

    Queries with equal uncertainty cannot be ranked; instead of an arbitrary order, each tied group contributes
    its errors in proportion to how many of its members are included (the expectation over orders), in float64. The
    counts are running sums of integers on the inputs' device (deterministic everywhere); no scatter or repeat, whose
    CPU kernels wake every thread of the pool for a few thousand queries (25x slower with 32 threads on 2 busy cores).
    """
    order = torch.argsort(uncertainty, stable=True)
    errors = (~correct.bool()[order]).long()
    _, group_of, group_sizes = torch.unique_consecutive(uncertainty[order], return_inverse=True, return_counts=True)
    group_end = torch.cumsum(group_sizes, 0) - 1
    errors_through_group = torch.cumsum(errors, 0)[group_end]
    errors_before_group = torch.cat([errors_through_group.new_zeros(1), errors_through_group[:-1]])
    group_errors = errors_through_group - errors_before_group
    position_in_group = torch.arange(1, len(errors) + 1, device=errors.device) - (group_end - group_sizes + 1)[group_of]
    share = (position_in_group * group_errors[group_of]).to(torch.float64) / group_sizes[group_of]
    return errors_before_group[group_of].to(torch.float64) + share


def risk_coverage_curve(correct: Tensor, uncertainty: Tensor) -> tuple[Tensor, Tensor]:
    """Selective risk (error rate) of the k most confident queries against coverage k / n, for k = 1..n.

    Ties in ``uncertainty`` are handled exactly: a tied group counts with its mean error rate.

    Args:
        correct: (n,) bool.
        uncertainty: (n,).

    Returns:
        (coverage, risk), both (n,) float64.

    Example:
        >>> coverage, risk = risk_coverage_curve(torch.tensor([True, False, True]), torch.tensor([0.1, 0.2, 0.3]))
        >>> coverage.tolist(), [round(r, 4) for r in risk.tolist()]
        ([0.3333333333333333, 0.6666666666666666, 1.0], [0.0, 0.5, 0.3333])
    """
    n = correct.numel()
    if n == 0:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty
    k = torch.arange(1, n + 1, dtype=torch.float64, device=correct.device)
    return k / n, _tie_aware_cumulative_errors(correct, uncertainty) / k


def area_under_risk_coverage(correct: Tensor, uncertainty: Tensor) -> Tensor:
    """Area under the risk-coverage curve (AURC): the mean selective risk over coverages 1/n .. 1.

    Lower is better; a perfect ranking of errors last gives ``(1 - acc) + acc * log(acc)`` asymptotically, a
    random ranking the overall error rate.

    Example:
        >>> correct = torch.tensor([True, False, True])
        >>> round(float(area_under_risk_coverage(correct, torch.tensor([0.1, 0.2, 0.3]))), 4)  # (0 + 1/2 + 1/3) / 3
        0.2778
        >>> round(float(area_under_risk_coverage(correct, torch.tensor([0.2, 0.1, 0.3]))), 4)  # (1 + 1/2 + 1/3) / 3
        0.6111
    """
    return selective_accuracies_and_aurc(correct, uncertainty, [])[1]


def selective_accuracy(correct: Tensor, uncertainty: Tensor, coverage: float) -> Tensor:
    """Accuracy of the ``coverage`` fraction of most confident queries (lowest uncertainty).

    ``ceil(coverage * n)`` queries are kept; ties at the cut count with their group's mean accuracy.

    Args:
        correct: (n,) bool.
        uncertainty: (n,).
        coverage: fraction in (0, 1].

    Returns:
        () accuracy.

    Example:
        >>> correct = torch.tensor([True, True, False, True])
        >>> vacuity = torch.tensor([0.1, 0.2, 0.3, 0.4])
        >>> float(selective_accuracy(correct, vacuity, 0.5)), float(selective_accuracy(correct, vacuity, 1.0))
        (1.0, 0.75)
    """
    return selective_accuracies_and_aurc(correct, uncertainty, [coverage])[0][0]


def selective_accuracies_and_aurc(
    correct: Tensor, uncertainty: Tensor, coverages: Sequence[float]
) -> tuple[Tensor, Tensor]:
    """``selective_accuracy`` at every coverage and ``area_under_risk_coverage``, from one ranking of the queries.

    Returns:
        ((len(coverages),) accuracies, () AURC); ``nan`` without queries.

    Example:
        >>> accuracy, aurc = selective_accuracies_and_aurc(
        ...     torch.tensor([True, False, True]), torch.tensor([0.1, 0.2, 0.3]), [1 / 3, 1.0]
        ... )
        >>> [round(a, 4) for a in accuracy.tolist()], round(float(aurc), 4)  # AURC (0 + 1/2 + 1/3) / 3
        ([1.0, 0.6667], 0.2778)
    """
    for coverage in coverages:
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
    n = correct.numel()
    if n == 0:
        return torch.full((len(coverages),), math.nan), torch.tensor(math.nan)
    risk = risk_coverage_curve(correct, uncertainty)[1]  # risk[k - 1]: the k most confident queries'
    kept = [max(1, math.ceil(coverage * n - 1e-9)) - 1 for coverage in coverages]
    accuracy = 1.0 - risk[torch.tensor(kept, dtype=torch.long, device=risk.device)]
    return accuracy.float(), risk.mean().float()


def calibration_bins(probability: Tensor, labels: Tensor, bins: int = 15) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin count, summed confidence and summed correctness of the top-class probability (sum-reducible).

    Bins are equal-width on [0, 1]; bin ``i`` holds confidences in ``(i / bins, (i + 1) / bins]`` (bin 0 also 0).

    Args:
        probability: (..., N) class probabilities (e.g. the expected Dirichlet probabilities ``alpha / S``).
        labels: (...) class indices.
        bins: number of bins.

    Returns:
        (count, confidence_sum, correct_sum), each (bins,) float64.
    """
    confidence, prediction = probability.reshape(-1, probability.shape[-1]).to(torch.float64).max(dim=-1)
    correct = (prediction == labels.reshape(-1)).to(torch.float64)
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    zeros = torch.zeros(bins, dtype=torch.float64, device=probability.device)
    return (
        zeros.index_add(0, index, torch.ones_like(confidence)),
        zeros.index_add(0, index, confidence),
        zeros.index_add(0, index, correct),
    )


def expected_calibration_error(probability: Tensor, labels: Tensor, bins: int = 15) -> Tensor:
    """Expected calibration error ``sum_b |B_b| / n * |acc(B_b) - conf(B_b)|`` of the top-class probability.

    Example:
        >>> probability = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
        >>> labels = torch.tensor([0, 1, 0, 1])
        >>> # bins of width 0.25: {0.6, 0.7} both right (|1 - 0.65| * 2/4), {0.9, 0.9} one right (|0.5 - 0.9| * 2/4)
        >>> round(float(expected_calibration_error(probability, labels, bins=4)), 4)
        0.375
    """
    return ece_from_bins(*calibration_bins(probability, labels, bins))


def ece_from_bins(count: Tensor, confidence_sum: Tensor, correct_sum: Tensor) -> Tensor:
    """ECE from the per-bin sums of ``calibration_bins`` (after summing them over batches or processes)."""
    total = count.sum()
    if float(total) == 0:
        return torch.tensor(math.nan)
    return ((correct_sum - confidence_sum).abs().sum() / total).float()


def auroc(scores: Tensor, positive: Tensor) -> Tensor:
    """Area under the ROC curve of ``scores`` for telling positives (e.g. out-of-distribution) from negatives.

    Equals the probability that a random positive scores higher than a random negative, ties counting one half
    (the Mann-Whitney statistic, computed from average ranks).

    Args:
        scores: (n,) higher means "more likely positive" (e.g. vacuity for OOD detection).
        positive: (n,) bool.

    Returns:
        () AUROC in [0, 1]; ``nan`` without positives or without negatives.

    Example:
        >>> auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([False, False, True, True]))
        tensor(0.7500)
        >>> auroc(torch.tensor([0.5, 0.5]), torch.tensor([False, True]))
        tensor(0.5000)
    """
    positive = positive.bool().reshape(-1)
    scores = scores.reshape(-1).to(torch.float64)
    n_pos = int(positive.sum())
    n_neg = positive.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return torch.tensor(math.nan)
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    # Average rank (1-based) of each group of equal scores.
    group_end = torch.cumsum(counts, 0).to(torch.float64)
    average_rank = group_end - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty_like(scores)
    ranks[order] = average_rank[inverse]
    rank_sum = ranks[positive].sum()
    return ((rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)).float()

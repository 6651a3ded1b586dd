"""Evaluation maths against hand-computed examples and brute-force definitions."""

import itertools
import math

import pytest
import torch

from units_lightning.metrics import functional as F


def test_threshold_accuracy_and_coverage_by_hand():
    correct = torch.tensor([True, True, False, True, False, False])
    vacuity = torch.tensor([0.05, 0.12, 0.18, 0.2, 0.5, 0.9])
    # vacuity < 0.2 keeps the first three (2 right), < 0.1 keeps one (right); 0.2 itself is not below 0.2.
    assert [float(x) for x in F.threshold_accuracy(correct, vacuity, 0.2)] == pytest.approx([2 / 3, 3 / 6])
    assert [float(x) for x in F.threshold_accuracy(correct, vacuity, 0.1)] == pytest.approx([1.0, 1 / 6])
    accuracy, coverage = F.threshold_accuracy(correct, vacuity, 0.01)
    assert math.isnan(float(accuracy)) and float(coverage) == 0.0


def test_threshold_curve_ends_at_overall_accuracy():
    correct = torch.rand(200) < 0.7
    vacuity = torch.rand(200) * 0.99
    accuracy, coverage = F.threshold_curve(correct, vacuity, F.curve_thresholds())
    assert float(coverage[-1]) == 1.0 and float(accuracy[-1]) == pytest.approx(float(correct.float().mean()))
    assert torch.all(coverage[1:] >= coverage[:-1])


def test_selective_accuracy_by_hand():
    correct = torch.tensor([True, False, True, True, False, True, True, False, True, True])
    vacuity = torch.arange(10) / 10.0
    assert float(F.selective_accuracy(correct, vacuity, 1.0)) == pytest.approx(0.7)
    assert float(F.selective_accuracy(correct, vacuity, 0.7)) == pytest.approx(5 / 7)  # first 7: 2 wrong
    assert float(F.selective_accuracy(correct, vacuity, 0.5)) == pytest.approx(3 / 5)
    assert float(F.selective_accuracy(correct, vacuity, 0.6)) == pytest.approx(4 / 6)
    with pytest.raises(ValueError):
        F.selective_accuracy(correct, vacuity, 0.0)


def test_ties_at_the_cut_count_with_their_mean():
    correct = torch.tensor([True, False, True, True])
    vacuity = torch.tensor([0.1, 0.3, 0.3, 0.5])
    # The 2 most confident: query 0 and one of the tie {1, 2} (1/2 right on average): expected accuracy 0.75.
    assert float(F.selective_accuracy(correct, vacuity, 0.5)) == pytest.approx(0.75)


def test_aurc_by_hand_and_against_the_average_over_tie_orders():
    correct = torch.tensor([True, False, True, False])
    vacuity = torch.tensor([0.1, 0.2, 0.3, 0.4])
    # risks at k = 1..4: 0, 1/2, 1/3, 2/4
    assert float(F.area_under_risk_coverage(correct, vacuity)) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    tied = torch.tensor([0.1, 0.2, 0.2, 0.2])
    orders = itertools.permutations([1, 2, 3])
    values = []
    for order in orders:
        ranked = correct[[0, *order]]
        values.append(F.area_under_risk_coverage(ranked, torch.arange(4.0)))
    assert float(F.area_under_risk_coverage(correct, tied)) == pytest.approx(float(torch.stack(values).mean()))


def test_selective_accuracies_and_aurc_rank_once_and_match_each_alone(monkeypatch):
    # One ranking for every coverage and the AURC: ranking 4,000 queries per coverage made a validation's metrics take
    # up to 0.47 s on a GPU host (docs/PERFORMANCE.md, "The validations' two values").
    generator = torch.Generator().manual_seed(0)
    correct = torch.rand(500, generator=generator) < 0.7
    uncertainty = (torch.rand(500, generator=generator) * 20).floor() / 20  # many ties
    coverages = [0.1, 0.25, 0.5, 0.83, 1.0]
    rankings = []
    ranked = F._tie_aware_cumulative_errors
    monkeypatch.setattr(F, "_tie_aware_cumulative_errors", lambda c, u: rankings.append(1) or ranked(c, u))
    accuracy, aurc = F.selective_accuracies_and_aurc(correct, uncertainty, coverages)
    assert len(rankings) == 1
    alone = [float(F.selective_accuracy(correct, uncertainty, c)) for c in coverages]
    assert accuracy.tolist() == pytest.approx(alone, abs=1e-7) and accuracy.dtype == torch.float32
    assert float(aurc) == pytest.approx(float(F.area_under_risk_coverage(correct, uncertainty)), abs=1e-7)
    empty_accuracy, empty_aurc = F.selective_accuracies_and_aurc(correct[:0], uncertainty[:0], coverages)
    assert torch.isnan(empty_accuracy).all() and empty_accuracy.shape == (5,) and math.isnan(float(empty_aurc))
    with pytest.raises(ValueError, match="coverage must lie in"):
        F.selective_accuracies_and_aurc(correct, uncertainty, [0.5, 1.5])
    no_coverage, same_aurc = F.selective_accuracies_and_aurc(correct, uncertainty, [])
    assert no_coverage.shape == (0,) and float(same_aurc) == float(aurc)


def test_ece_by_hand():
    probability = torch.tensor([[0.95, 0.05], [0.85, 0.15], [0.3, 0.7], [0.45, 0.55]])
    labels = torch.tensor([0, 1, 1, 1])
    # 10 bins: 0.95 (right) in bin 9, 0.85 (wrong) in bin 8, 0.7 (right) in bin 6, 0.55 (right) in bin 5.
    expected = (abs(1 - 0.95) + abs(0 - 0.85) + abs(1 - 0.7) + abs(1 - 0.55)) / 4
    assert float(F.expected_calibration_error(probability, labels, bins=10)) == pytest.approx(expected)
    # One bin: |mean accuracy - mean confidence|.
    one_bin = abs(3 / 4 - (0.95 + 0.85 + 0.7 + 0.55) / 4)
    assert float(F.expected_calibration_error(probability, labels, bins=1)) == pytest.approx(one_bin)


def test_auroc_by_hand_and_by_pair_counting():
    scores = torch.tensor([0.2, 0.5, 0.5, 0.9, 0.1, 0.5])
    positive = torch.tensor([False, False, True, True, False, True])
    # Pairs (positive, negative): 3 x 3 = 9; positive 0.5 beats 0.2 and 0.1, ties 0.5 (twice, half each) ...
    wins = sum(
        1.0 if p > n else 0.5 if p == n else 0.0 for p in scores[positive].tolist() for n in scores[~positive].tolist()
    )
    assert float(F.auroc(scores, positive)) == pytest.approx(wins / 9)
    assert float(F.auroc(torch.tensor([0.1, 0.9]), torch.tensor([False, True]))) == 1.0
    assert float(F.auroc(torch.tensor([0.9, 0.1]), torch.tensor([False, True]))) == 0.0
    assert math.isnan(float(F.auroc(torch.tensor([0.1]), torch.tensor([True]))))


def test_mean_confidence_interval_matches_numpy_style_formula():
    values = torch.tensor([0.2, 0.4, 0.4, 1.0, 0.6])
    mean, half = F.mean_confidence_interval(values.sum(), (values**2).sum(), torch.tensor(5))
    assert float(mean) == pytest.approx(0.52)
    assert float(half) == pytest.approx(1.96 * float(values.std(unbiased=True)) / math.sqrt(5), rel=1e-5)

"""Accuracy against a vacuity threshold: closed forms, sums over batches, argument checks."""

import pytest
import torch

from units_lightning.callbacks import UncertaintyCurves
from units_lightning.metrics.functional import threshold_counts, threshold_curve


def vacuity_threshold_counts(vacuity, correct, thresholds):
    return threshold_counts(correct, vacuity, thresholds)


def vacuity_threshold_curve(vacuity, correct, thresholds):
    return threshold_curve(correct, vacuity, thresholds)


def test_curve_closed_form():
    vacuity = torch.tensor([[0.05, 0.15], [0.35, 0.95]])
    correct = torch.tensor([[True, False], [True, False]])
    accuracy, coverage = vacuity_threshold_curve(vacuity, correct, torch.tensor([0.01, 0.1, 0.2, 0.5, 1.0]))
    torch.testing.assert_close(coverage, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert torch.isnan(accuracy[0])  # no query is that sure
    torch.testing.assert_close(accuracy[1:], torch.tensor([1.0, 0.5, 2 / 3, 0.5]))


def test_threshold_is_strict_as_in_the_paper():
    kept, _ = vacuity_threshold_counts(torch.tensor([0.2, 0.2]), torch.tensor([True, True]), torch.tensor([0.2]))
    assert kept.tolist() == [0]


def test_counts_add_up_over_batches():
    generator = torch.Generator().manual_seed(0)
    vacuity = torch.rand(6, 10, generator=generator)
    correct = torch.rand(6, 10, generator=generator) > 0.4
    thresholds = torch.linspace(0.1, 1.0, 10)
    whole = vacuity_threshold_counts(vacuity, correct, thresholds)
    parts = [
        vacuity_threshold_counts(v, c, thresholds) for v, c in zip(vacuity.split(2), correct.split(2), strict=True)
    ]
    assert torch.equal(whole[0], sum(p[0] for p in parts)) and torch.equal(whole[1], sum(p[1] for p in parts))
    accuracy, coverage = vacuity_threshold_curve(vacuity, correct, thresholds)
    assert torch.all(coverage.diff() >= 0) and coverage[-1] == 1.0
    torch.testing.assert_close(accuracy[-1], correct.float().mean())


@pytest.mark.parametrize(
    "thresholds", [[], [0.0, 0.5], [1.5], [0.201, 0.204]], ids=["empty", "zero", "above_one", "same_key"]
)
def test_bad_thresholds_are_rejected(thresholds):
    with pytest.raises(ValueError, match="thresholds"):
        UncertaintyCurves(thresholds)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="differ in shape"):
        vacuity_threshold_counts(torch.rand(3), torch.ones(4, dtype=torch.bool), torch.tensor([0.5]))

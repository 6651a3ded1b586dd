"""The Metric classes accumulate batches to the same numbers as the functions on everything at once."""

import math

import pytest
import torch

from units_lightning.belief import theorem_one_margin
from units_lightning.metrics import (
    DetectionAUROC,
    ExpectedCalibrationError,
    RiskCoverage,
    ShiftMetrics,
    TaskMean,
    TheoremOneCheck,
    UncertaintyMetrics,
    VacuityThresholdAccuracy,
)
from units_lightning.metrics import functional as F


def _queries(seed, tasks=7, queries=6, ways=5):
    generator = torch.Generator().manual_seed(seed)
    probability = torch.softmax(3 * torch.randn(tasks, queries, ways, generator=generator), -1)
    labels = torch.randint(ways, (tasks, queries), generator=generator)
    vacuity = torch.rand(tasks, queries, generator=generator)
    return probability, labels, vacuity, probability.argmax(-1) == labels


def test_batched_updates_equal_the_functions_on_all_queries():
    parts = [_queries(seed) for seed in range(3)]
    probability, labels, vacuity, correct = (torch.cat(x) for x in zip(*parts, strict=True))
    curve, risk, ece, task_mean = (
        VacuityThresholdAccuracy([0.2, 0.5]),
        RiskCoverage([1.0, 0.6]),
        ExpectedCalibrationError(10),
        TaskMean(),
    )
    for p, y, v, c in parts:
        curve.update(c, v)
        risk.update(c, v)
        ece.update(p, y)
        task_mean.update(c.float())
    accuracy, coverage = curve.compute()
    expected = F.threshold_curve(correct.flatten(), vacuity.flatten(), [0.2, 0.5])
    assert torch.allclose(accuracy, expected[0]) and torch.allclose(coverage, expected[1])
    selective, aurc = risk.compute()
    assert float(selective[1]) == pytest.approx(float(F.selective_accuracy(correct.flatten(), vacuity.flatten(), 0.6)))
    assert float(aurc) == pytest.approx(float(F.area_under_risk_coverage(correct.flatten(), vacuity.flatten())))
    assert float(ece.compute()) == pytest.approx(float(F.expected_calibration_error(probability, labels, 10)), rel=1e-6)
    per_task = correct.float().mean(1)
    mean, half = task_mean.compute()
    assert float(mean) == pytest.approx(float(per_task.mean()))
    assert float(half) == pytest.approx(1.96 * float(per_task.std()) / per_task.numel() ** 0.5, rel=1e-5)


def test_uncertainty_metrics_report_and_stable_keys():
    metrics = UncertaintyMetrics(vacuity_thresholds=[0.1, 0.2], coverages=[1.0, 0.5])
    probability, labels, vacuity, correct = _queries(0)
    beliefs = {name: torch.rand(correct.shape) for name in ("dissonance", "incorrect_belief", "correct_belief")}
    metrics.update({"probability": probability, "labels": labels, "vacuity": vacuity, "correct": correct, **beliefs})
    results = metrics.compute()
    assert results["tasks"] == 7 and results["queries"] == 42
    assert results["accuracy"]["mean"] == pytest.approx(float(correct.float().mean()))
    assert results["vacuity"]["mean"] == pytest.approx(float(vacuity.mean()))
    # the most confident by vacuity, and by the largest expected probability (here independent of vacuity)
    confidence = 1.0 - probability.amax(-1)
    assert results["aurc"] == pytest.approx(float(F.area_under_risk_coverage(correct.flatten(), vacuity.flatten())))
    by_probability = float(F.area_under_risk_coverage(correct.flatten(), confidence.flatten()))
    assert results["aurc_max_probability"] == pytest.approx(by_probability)
    assert abs(by_probability - results["aurc"]) > 1e-3  # the two rankings differ on these queries
    half_by_probability = float(F.selective_accuracy(correct.flatten(), confidence.flatten(), 0.5))
    assert results["selective_accuracy_max_probability"][1] == {"coverage": 0.5, "accuracy": half_by_probability}
    scalars = metrics.scalars(results)
    assert scalars["acc"] == results["accuracy"]["mean"] and scalars["vacuity"] == results["vacuity"]["mean"]
    assert scalars["aurc_max_probability"] == results["aurc_max_probability"]
    assert sorted(scalars) == [
        "acc",
        "acc_ci95",
        "acc_vacuity_below_0p10",
        "acc_vacuity_below_0p20",
        "aurc",
        "aurc_max_probability",
        "correct_belief",
        "coverage_vacuity_below_0p10",
        "coverage_vacuity_below_0p20",
        "dissonance",
        "ece",
        "incorrect_belief",
        "selective_acc_100",
        "selective_acc_50",
        "selective_acc_max_probability_100",
        "selective_acc_max_probability_50",
        "vacuity",
    ]
    metrics.reset()
    assert float(metrics.accuracy.count) == 0 and float(metrics.curve.total) == 0
    with pytest.raises(ValueError, match="two decimals"):
        UncertaintyMetrics(vacuity_thresholds=[0.201, 0.204])


def test_theorem_one_check_counts_tasks_and_keeps_the_smallest_margin():
    generator = torch.Generator().manual_seed(0)
    parts = [(torch.rand(4, 5, generator=generator), torch.rand(4, 5, generator=generator)) for _ in range(3)]
    check = TheoremOneCheck(atol=0.0)
    for incorrect, dissonance in parts:
        check.update(incorrect, dissonance)
    margin = torch.cat([theorem_one_margin(i, d) for i, d in parts]).double()
    holds, smallest = check.compute()
    assert int(check.tasks) == 12 and int(check.holds) == int((margin >= 0).sum())
    assert float(holds) == pytest.approx(float((margin >= 0).double().mean()))
    assert float(smallest) == float(margin.min())
    check.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        holds, smallest = check.compute()
    assert math.isnan(float(holds)) and math.isinf(float(smallest))
    with pytest.raises(ValueError, match="atol"):
        TheoremOneCheck(atol=-1.0)


def test_shift_metrics_auroc_separates_clean_from_shifted():
    metrics = ShiftMetrics()
    metrics.update(torch.full((2, 3), 0.2), torch.full((2, 3), 0.6), None)
    result = metrics.compute()
    assert result["auroc"] == 1.0 and result["accuracy"] is None and result["vacuity"]["mean"] == pytest.approx(0.6)
    empty = DetectionAUROC()
    empty.update(torch.tensor([0.3, 0.4]), positive=False)
    assert math.isnan(float(empty.compute()))  # no positives: undefined


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))],
)
def test_risk_coverage_ranks_where_its_states_are_with_the_same_numbers(device):
    # On a GPU the ranking stays there (the CPU's indexing kernels wake a 32-thread pool); the counts are integers, so
    # the numbers are those of the CPU to the bit.
    generator = torch.Generator().manual_seed(3)
    correct = torch.rand(4000, generator=generator) < 0.8
    uncertainty = (torch.rand(4000, generator=generator) * 40).floor() / 40
    metric = RiskCoverage([0.1, 0.5, 1.0]).to(device)
    for part in range(4):
        metric.update(correct[part::4].to(device), uncertainty[part::4].to(device))
    accuracy, aurc = metric.compute()
    assert accuracy.device.type == aurc.device.type == device
    order = torch.cat([torch.arange(part, 4000, 4) for part in range(4)])
    expected = F.selective_accuracies_and_aurc(correct[order], uncertainty[order], [0.1, 0.5, 1.0])
    assert torch.equal(accuracy.cpu(), expected[0]) and torch.equal(aurc.cpu(), expected[1])

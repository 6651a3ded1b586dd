"""``CollapseMonitor``: a warning when accuracy stays at chance with vacuity near 0 or 1, and not otherwise, with the
diagnosis of what to change (kept for the fit summary). ``tests/test_evidence_freeze.py`` trains into the freeze."""

import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import CollapseMonitor, TrainingCollapseWarning
from units_lightning.callbacks.collapse_monitor import collapse_diagnosis
from units_lightning.losses import CrossEntropyLoss, EvidentialLoss
from units_lightning.samplers import MultiQuerySampler


def fit(tmp_path, lr, window=5):
    pl.seed_everything(0, verbose=False)
    monitor = CollapseMonitor(window=window)
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    tiny_trainer(tmp_path, max_steps=10, callbacks=[monitor]).fit(tiny_model(lr=lr, sampler=data.sampler), data)
    return monitor


def test_a_diverged_run_gets_a_warning_naming_the_steps_and_the_causes(tmp_path):
    with pytest.warns(TrainingCollapseWarning) as caught:
        monitor = fit(tmp_path, lr=1e6)
    (warning,) = [w for w in caught if issubclass(w.category, TrainingCollapseWarning)]
    message = str(warning.message)
    assert message == monitor.warning
    assert message.startswith("training looks collapsed at step 9: over the 5 steps 5-9 the labeled queries were ")
    assert monitor.step == 9
    assert "(chance 20.00%) with mean vacuity 0.0000 (evidence saturated" in message
    assert monitor.diagnosis.startswith("the meta-update diverged") and f"Diagnosis: {monitor.diagnosis}." in message
    for cause in ("model.lr", "model.inner_lr", "collapse.window (now 5)"):
        assert cause in message
    assert "vacuity_weight" not in message  # the freeze's remedies are not this collapse's


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_saturation_names_the_vacuity_regulariser_first_when_the_run_uses_it(weight):
    # At weight 1.0 the regulariser saturated every CIFAR-FS screening run at chance (docs/RESULTS.md): a saturated
    # collapse with it on is its doing before it is the learning rates'.
    loss = EvidentialLoss(vacuity_weight=weight)
    monitor = CollapseMonitor(window=3)
    with pytest.warns(TrainingCollapseWarning, match="evidence saturated"):
        feed(monitor, [outputs(0.2, 0.0)] * 3, loss=loss)
    assert monitor.diagnosis == collapse_diagnosis(False, loss, 2.0, 5)
    assert "model.lr" in monitor.diagnosis and "model.inner_lr" in monitor.diagnosis
    if weight:
        assert monitor.diagnosis.startswith("evidence saturated (every query claims certainty) under the vacuity")
        assert "lower model.loss.vacuity_weight (now 1) or set it to 0" in monitor.diagnosis
    else:
        assert monitor.diagnosis.startswith("the meta-update diverged")
        assert "vacuity_weight" not in monitor.diagnosis


def test_a_healthy_run_at_chance_with_ordinary_vacuity_gets_none(tmp_path):
    # The tiny model stays near chance for its first steps, but its evidence is not saturated.
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingCollapseWarning)
        monitor = fit(tmp_path, lr=5e-3)
    assert monitor.warning is None and monitor.diagnosis is None


def outputs(accuracy, vacuity, queries=10):
    correct = torch.arange(queries) < round(accuracy * queries)
    return {"correct": correct.reshape(2, -1), "vacuity": torch.full((2, queries // 2), vacuity), "eta": 2.0}


def feed(monitor, steps, n_way=5, loss=None):
    trainer, module = SimpleNamespace(global_step=0), SimpleNamespace(n_way=n_way, loss=loss)
    for values in steps:
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, values, None, 0)


def test_vacuity_near_one_is_a_collapse_too_and_non_finite_steps_are_left_out():
    monitor = CollapseMonitor(window=4)
    with pytest.warns(
        TrainingCollapseWarning,
        match=r"step 3: over the 4 steps 0-3 .* 20.00% .* mean vacuity 0.9950 "
        r"\(no evidence: every query is vacuous\)\. Diagnosis: zero-evidence learning freeze .*"
        r"a smaller eta \(model.eta, 2 at these steps",
    ):
        feed(monitor, [outputs(0.2, 0.995), outputs(0.2, 0.995), outputs(0.9, float("nan")), outputs(0.2, 0.995)])


@pytest.mark.parametrize(
    "loss,named,not_named",
    [
        (
            EvidentialLoss(activation="relu"),
            [
                "vacuity_weight, now 0; start small: 0.01 kept mini-ImageNet 5w1s learning",
                "1.0, the authors' value, saturated",
                "ib_reduction, now 'sum'",
                "n_way = 5",
                "activation, now 'relu'",
            ],
            [],
        ),
        (
            EvidentialLoss(ib_reduction="mean", vacuity_weight=0.5),
            ["a larger vacuity regulariser weight (model.loss.vacuity_weight, now 0.5)"],
            ["ib_reduction", "activation"],
        ),
        (CrossEntropyLoss(), ["a smaller eta"], ["vacuity_weight", "ib_reduction", "activation"]),
    ],
    ids=["relu-sum-off", "softplus-mean-on", "cross-entropy"],
)
def test_a_freeze_names_the_loss_options_the_run_does_not_use_yet(loss, named, not_named):
    monitor = CollapseMonitor(window=3)
    with pytest.warns(TrainingCollapseWarning):
        feed(monitor, [outputs(0.2, 1.0)] * 3, loss=loss)
    assert monitor.diagnosis == collapse_diagnosis(True, loss, 2.0, 5)
    assert monitor.diagnosis.startswith("zero-evidence learning freeze (Pandey & Yu, ICML 2023")
    assert f"Diagnosis: {monitor.diagnosis}." in monitor.warning
    assert "a smaller eta (model.eta, 2 at these steps; lower its peak)" in monitor.diagnosis
    for option in named:
        assert option in monitor.diagnosis
    for option in not_named:
        assert option not in monitor.diagnosis


def test_the_diagnosis_is_printed_once_when_the_fit_ends_and_cleared_when_a_fit_starts(caplog):
    monitor = CollapseMonitor(window=2)
    with pytest.warns(TrainingCollapseWarning):
        feed(monitor, [outputs(0.2, 1.0)] * 2, loss=EvidentialLoss())
    with caplog.at_level("INFO"):
        monitor.on_fit_end(SimpleNamespace(), SimpleNamespace())
    (record,) = [r for r in caplog.records if "CollapseMonitor" in r.getMessage()]
    assert record.getMessage() == f"CollapseMonitor: training collapsed; {monitor.diagnosis}"
    monitor.on_train_start(SimpleNamespace(), SimpleNamespace())
    assert monitor.warning is None and monitor.diagnosis is None
    caplog.clear()
    with caplog.at_level("INFO"):
        monitor.on_fit_end(SimpleNamespace(), SimpleNamespace())
    assert not [r for r in caplog.records if "CollapseMonitor" in r.getMessage()]


@pytest.mark.parametrize(
    "accuracy,vacuity", [(0.6, 0.0), (0.2, 0.3), (0.2, 0.98)], ids=["learning", "ordinary-vacuity", "vacuity-0.98"]
)
def test_no_warning_unless_both_hold(accuracy, vacuity):
    monitor = CollapseMonitor(window=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingCollapseWarning)
        feed(monitor, [outputs(accuracy, vacuity)] * 9)
    assert monitor.warning is None


def test_window_zero_switches_the_check_off_and_bad_settings_are_refused():
    monitor = CollapseMonitor(window=0)
    feed(monitor, [outputs(0.2, 0.0)] * 50)
    assert monitor.warning is None
    with pytest.raises(ValueError, match=r"collapse window must be >= 0 steps \(0 switches the check off\), got -1"):
        CollapseMonitor(window=-1)
    with pytest.raises(ValueError, match=r"vacuity_margin must be in \[0, 0.5\), got 0.5"):
        CollapseMonitor(vacuity_margin=0.5)
    with pytest.raises(ValueError, match=r"chance_margin must be an accuracy margin in \[0, 1\], got 2"):
        CollapseMonitor(chance_margin=2)


def test_window_sums_leave_out_non_finite_steps_in_both_forms():
    """One batch of sums where the steps' shapes agree, one per step where they do not (a trimmed last step): the
    same sums, non-finite steps left out."""
    from units_lightning.callbacks.collapse_monitor import window_sums

    def step(right, vacuity):
        return torch.tensor(right), torch.tensor(vacuity)

    same = [step([[True, False]], [[0.5, 0.25]]), step([[True, True]], [[float("nan"), 0.0]]),
            step([[False, True]], [[1.0, 0.5]])]  # fmt: skip
    assert window_sums(same).tolist() == [2.0, 2.25, 4.0]
    none = (torch.zeros(0, 2, dtype=torch.bool), torch.zeros(0, 2))  # a step that labeled nothing
    ragged = [*same, step([[True, True], [True, False]], [[0.0, 0.0], [0.25, 0.25]]), none]
    assert window_sums(ragged).tolist() == [5.0, 2.75, 8.0]
    assert window_sums([none, none]).tolist() == [0.0, 0.0, 0.0]

"""``CollapseMonitor``: a warning when accuracy stays at chance with vacuity near 0 or 1, and not otherwise."""

import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import CollapseMonitor, TrainingCollapseWarning
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
    assert "(chance 20.00%) with mean vacuity 0.0000 (evidence saturated" in message
    for cause in ("model.lr", "model.inner_lr", "eta", "collapse.window (now 5)"):
        assert cause in message


def test_a_healthy_run_at_chance_with_ordinary_vacuity_gets_none(tmp_path):
    # The tiny model stays near chance for its first steps, but its evidence is not saturated.
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingCollapseWarning)
        assert fit(tmp_path, lr=5e-3).warning is None


def outputs(accuracy, vacuity, queries=10):
    correct = torch.arange(queries) < round(accuracy * queries)
    return {"correct": correct.reshape(2, -1), "vacuity": torch.full((2, queries // 2), vacuity), "eta": 2.0}


def feed(monitor, steps, n_way=5):
    trainer, module = SimpleNamespace(global_step=0), SimpleNamespace(n_way=n_way)
    for values in steps:
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, values, None, 0)


def test_vacuity_near_one_is_a_collapse_too_and_non_finite_steps_are_left_out():
    monitor = CollapseMonitor(window=4)
    with pytest.warns(
        TrainingCollapseWarning,
        match=r"step 3: over the 4 steps 0-3 .* 20.00% .* mean vacuity 0.9950 "
        r"\(no evidence: every query is vacuous\).*eta, 2 at this step",
    ):
        feed(monitor, [outputs(0.2, 0.995), outputs(0.2, 0.995), outputs(0.9, float("nan")), outputs(0.2, 0.995)])


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

"""benchmarks/fit.py: the capture a full run uses; --sync-check: host synchronisations counted per kind of step."""

import warnings

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from benchmarks import fit
from units_lightning.samplers import RandomSampler

SyncWatch = fit.SyncWatch
REPO = fit.REPO


def config(name):
    return yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    "name,steps,capture",
    [
        ("omniglot_20w1s", 50_000, "compile"),  # 100 epochs of 500 steps
        ("miniimagenet_5w1s", 100_000, "compile"),
        ("omniglot_5w5s", 10_000, "cuda_graph"),  # 100 epochs of 100 steps
        ("budget_omniglot_5w1s", 5_000, "cuda_graph"),  # max_steps below 10 epochs of 500
        ("quickstart", 300, "cuda_graph"),
    ],
)
def test_the_benchmark_times_the_capture_of_the_configs_full_run(name, steps, capture):
    # fit.py shortens every run with --trainer.max_steps, which would turn capture auto into CUDA graphs for all of
    # them: it passes the capture that the config's full-length run resolves auto to instead.
    assert fit.planned_steps(config(name)) == steps
    assert fit.full_run_capture(config(name), "cuda", []) == capture
    assert fit.full_run_capture(config(name), "cpu", []) is None  # CPU: the config as it is
    assert fit.full_run_capture(config(name), "cuda", ["--model.capture", "none"]) is None  # asked for


def test_planned_steps_of_an_unbounded_run_is_infinite():
    assert fit.planned_steps({"trainer": {"max_epochs": -1}}) == float("inf")
    assert fit.planned_steps({"trainer": {"max_steps": 7, "max_epochs": 3, "limit_train_batches": 0.5}}) == 7


class Synchronises(Callback):
    """Warns as CUDA's sync debug mode does, once in every step, and once more in a step that logs."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        if trainer._logger_connector.should_update_logs:
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("some other warning", UserWarning, stacklevel=1)


def test_synchronisations_are_counted_in_the_watched_steps_by_kind(tmp_path, monkeypatch, capsys):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(SyncWatch, "can_watch", staticmethod(lambda pl_module: True))
    watch = SyncWatch(2, 6)
    data = tiny_data(RandomSampler(tasks=2))
    trainer = tiny_trainer(tmp_path, max_steps=8, log_every_n_steps=3, callbacks=[Synchronises(), watch])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # outside the window
        showwarning, filters = warnings.showwarning, warnings.filters[:]
        trainer.fit(tiny_model(sampler=data.sampler), data)
        assert warnings.showwarning is showwarning and warnings.filters == filters  # restored after the window
    # Steps 2, 3, 4 and 5 are watched; of those, 2 and 5 log (every third step, counted from 0: 2, 5, 8).
    assert watch.count("quiet") == 2
    assert watch.count("logging") == 4
    assert modes == ["warn", 0]  # the debug mode is switched off after the window
    watch.report()
    printed = capsys.readouterr().out
    assert "synchronisations in steps 2-5: 2 in quiet steps, 4 in logging steps (4 steps)" in printed
    assert "on_train_batch_end" in printed  # the stack of each


def test_nothing_is_watched_off_cuda(tmp_path, monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    watch = SyncWatch(0, 3)
    data = tiny_data(RandomSampler(tasks=2))
    trainer = tiny_trainer(tmp_path, max_steps=4, callbacks=[Synchronises(), watch])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(tiny_model(sampler=data.sampler), data)
    assert modes == [] and watch.count("quiet") == watch.count("logging") == 0

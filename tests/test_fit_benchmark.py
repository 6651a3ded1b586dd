"""benchmarks/fit.py --sync-check: host synchronisations counted per kind of step, each with its stack."""

import warnings

import torch
from lightning.pytorch.callbacks import Callback
from tiny_setup import benchmark, tiny_data, tiny_model, tiny_trainer

from units_lightning.samplers import RandomSampler

SyncWatch = benchmark("fit").SyncWatch


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

"""``CheckpointOnSigterm``: every fit (the module adds it) writes ``last.ckpt`` at the step SIGTERM arrives, and under
data-parallel training Lightning looks for the signal at the logging steps only."""

import os
import signal
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks.sigterm import CheckpointOnSigterm
from units_lightning.samplers import RandomSampler
from units_lightning.sigterm import check_sigterm_at_logging_steps

# Three epochs of three steps, validated (and ``last.ckpt`` saved) after each epoch's last step only.
EPOCHS = dict(max_steps=9, max_epochs=3, limit_train_batches=3, limit_val_batches=1, num_sanity_val_steps=0)


class SigtermAt(Callback):
    """SIGTERM to this process during training step ``step`` (1-based)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


def fit(root, *callbacks):
    pl.seed_everything(0, verbose=False)
    data = tiny_data(RandomSampler(tasks=2))
    last = ModelCheckpoint(dirpath=root / "checkpoints", filename="last")
    trainer = tiny_trainer(root, enable_checkpointing=True, callbacks=[last, *callbacks], **EPOCHS)
    try:
        trainer.fit(tiny_model(sampler=data.sampler), data)
    finally:
        assert sum(isinstance(c, CheckpointOnSigterm) for c in trainer.callbacks) == 1
    return trainer


@pytest.mark.parametrize(("step", "saved"), [(5, 5), (3, 3)], ids=["mid-epoch", "an-epochs-last-step"])
def test_sigterm_writes_last_ckpt_at_that_step_without_being_configured(tmp_path, step, saved):
    # Step 5 is in the middle of an epoch: the callback saves there (ModelCheckpoint alone saves at step 3). Step 3
    # ends an epoch: the callback leaves it (a resume would count that epoch twice); the validation after it saves.
    with pytest.raises(SIGTERMException):
        fit(tmp_path, SigtermAt(step))
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == saved and checkpoint["label_ledger"]["query_sets"] == 2 * saved


def test_a_configured_callback_is_not_added_twice(tmp_path):
    trainer = fit(tmp_path, CheckpointOnSigterm())
    assert trainer.global_step == 9


class Loop:
    """Lightning's training epoch loop, as far as the SIGTERM check reads it."""

    def __init__(self):
        self._batches_that_stepped, self.checked = 0, []

    def _broadcast_sigterm_tensor(self):
        self.checked.append(self._batches_that_stepped + 1)


@pytest.mark.parametrize(("world_size", "expected"), [(2, [5, 10]), (1, list(range(1, 11)))], ids=["ddp", "one"])
def test_data_parallel_training_checks_for_sigterm_at_the_logging_steps_only(world_size, expected):
    loop = Loop()
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop), world_size=world_size, log_every_n_steps=5)
    CheckpointOnSigterm().on_fit_start(trainer, None)
    assert check_sigterm_at_logging_steps(trainer) == (world_size > 1)  # moved once more: still at logging steps
    for step in range(10):
        loop._batches_that_stepped = step
        loop._broadcast_sigterm_tensor()
    assert loop.checked == expected

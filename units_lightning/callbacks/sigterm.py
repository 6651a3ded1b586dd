"""``CheckpointOnSigterm``: a fit stopped by SIGTERM resumes from the step it reached, and the check for the signal
costs data-parallel training nothing per step."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning.sigterm import check_sigterm_at_logging_steps

__all__ = ["CheckpointOnSigterm"]


class CheckpointOnSigterm(Callback):
    """Write ``last.ckpt`` at the end of the training step during which SIGTERM arrived, so that ``--ckpt_path last``
    continues from that step rather than from the last validation; under data-parallel training, look for the signal
    at the logging steps only (``check_sigterm_at_logging_steps``).

    ``UnitsMAML`` adds one to every trainer (``configure_callbacks``), so every ``fit``, from the command line or from
    Python, behaves alike. Lightning stops at the next step boundary on SIGTERM (``SIGTERMException``) without a
    checkpoint. This saves in ``on_train_batch_end``, where ``ModelCheckpoint(every_n_train_steps=...)`` saves, and
    only at a step in the middle of an epoch that no validation follows: a run resumed from a save at an epoch's last
    step ended an epoch short (6 of 9 steps over three epochs of three), and one saved before a validation that the
    signal then cuts short would come back without that validation. At those steps, and when the signal arrives
    during validation, nothing is saved and the run continues from the ``last.ckpt`` before (in the shipped configs
    an epoch's last step is validated and checkpointed anyway). The file goes where the trainer's
    ``ModelCheckpoint`` writes its ``last.ckpt`` (nothing is written without one), through the trainer's checkpoint
    IO. One process only: under data-parallel training the ranks need not see the signal at the same step.
    """

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        check_sigterm_at_logging_steps(trainer)  # under DDP: not a collective and a read at every step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.received_sigterm or trainer.world_size > 1 or not _quiet_step(trainer, batch_idx):
            return
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if folder is not None:
            trainer.save_checkpoint(os.path.join(folder, "last.ckpt"))


def _quiet_step(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Neither an epoch's last step, nor one that a validation may follow, nor the last step of training."""
    epoch_end = (
        trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches
    )
    if epoch_end or trainer.should_stop:
        return False
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return False
    every = getattr(trainer, "val_check_batch", None)
    if isinstance(every, int) and every > 0 and ((batch_idx + 1) % every == 0 or trainer.global_step % every == 0):
        return False
    return True

"""``RecordRunVersion``: every checkpoint names the logger run that wrote it, so a resume continues that run."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning.resume import RUN_KEY

__all__ = ["RecordRunVersion"]


class RecordRunVersion(Callback):
    """Write ``{"logger": class name, "version": run version}`` of the trainer's first logger into each checkpoint.

    The version is the W&B run id for ``WandbLogger`` and ``N`` of ``version_N`` for ``CSVLogger`` and
    ``TensorBoardLogger``. ``units-lightning fit --ckpt_path last`` reads it back (``units_lightning.resume.
    stored_run``) and gives it to the new logger, so the resumed run's history continues the same W&B run (and
    the same CSV / TensorBoard folder) and its checkpoints go on in the same folder.
    """

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]):
        logger = trainer.logger
        version = None if logger is None else logger.version
        checkpoint[RUN_KEY] = {
            "logger": None if logger is None else type(logger).__name__,
            "version": version if isinstance(version, (str, int)) else None,
        }

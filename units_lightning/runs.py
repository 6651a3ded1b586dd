"""Where a run's own files go (``summary.json``, ``config.yaml``, ``results.json``, predictions)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

__all__ = ["run_directory"]


def run_directory(trainer: pl.Trainer) -> Path:
    """The W&B run's files folder, else the logger's or the trainer's log dir.

    Unlike ``trainer.log_dir`` it broadcasts nothing, so rank zero alone may call it.
    """
    logger = trainer.logger
    if isinstance(logger, WandbLogger):
        return Path(logger.experiment.dir)
    if isinstance(logger, (CSVLogger, TensorBoardLogger)):
        return Path(logger.log_dir)
    if logger is not None and logger.save_dir is not None:
        return Path(logger.save_dir)
    return Path(trainer.default_root_dir)

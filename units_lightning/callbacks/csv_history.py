"""``CSVHistory``: a resumed fit keeps the ``metrics.csv`` rows of the segments before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.loggers import CSVLogger
from lightning.pytorch.callbacks import Callback

from units_lightning.csv_history import next_segment, save_segment

__all__ = ["CSVHistory"]


class CSVHistory(Callback):
    """Copy each ``CSVLogger``'s ``metrics.csv`` to ``metrics/segment-<NN>.csv`` beside it while a fit runs: at every
    checkpoint, at the end of training and when the fit stops on an exception (SIGTERM included).

    A fit resumed with ``--ckpt_path last`` continues its logger's version, and Lightning's CSV writer deletes the
    ``metrics.csv`` it finds there before any callback runs; the copies keep what it deletes. Each fit writes its
    own segment (NN one above those saved before); ``units_lightning.csv_history.log_metrics`` reads the segments
    and ``metrics.csv`` back as one history, each step once, which is what ``units-lightning report`` shows. Rows
    logged after a fit's last checkpoint are logged again by the fit resumed from it.

    Only rank zero writes. With several ``CSVHistory`` in one trainer, the first does the work.
    """

    def __init__(self) -> None:
        self._segments: dict[Path, int] = {}  # log folder -> NN of this fit's segment

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._segments = {}
        if stage != "fit" or not trainer.is_global_zero or not self._acts(trainer):
            return
        for logger in trainer.loggers:
            folder = _local_log_dir(logger)
            if folder is not None:
                self._segments[folder] = next_segment(folder)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]):
        self._save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._save(trainer)

    def _acts(self, trainer: pl.Trainer) -> bool:
        return next(c for c in trainer.callbacks if isinstance(c, CSVHistory)) is self

    def _save(self, trainer: pl.Trainer) -> None:
        if not self._segments or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            folder = _local_log_dir(logger)
            if folder in self._segments:
                logger.save()  # the writer keeps rows in memory between flushes: write them first
                save_segment(folder, self._segments[folder])


def _local_log_dir(logger: Any) -> Path | None:
    """The log folder of a ``CSVLogger`` on the local file system, else None."""
    if not isinstance(logger, CSVLogger) or "://" in str(logger.log_dir):
        return None
    return Path(logger.log_dir)

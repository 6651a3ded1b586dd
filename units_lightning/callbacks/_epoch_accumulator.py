"""``EpochAccumulator``: a callback that gathers step outputs over each epoch of some stages and logs at its end.

The shell of ``TheoremOneMonitor`` and ``UncertaintyCurves``: Lightning has a start, a batch-end and an end hook
for each of train, validation and test; this class maps all of them onto three methods that take the stage.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning import keys


class EpochAccumulator(Callback):
    """Call ``start``, ``update`` and ``finish`` around each epoch of the stages in ``stages``.

    - ``start(pl_module, stage)`` at each epoch's start, and for training also at the train start: a run
      resumed mid-epoch gets no ``on_train_epoch_start`` (Lightning skips it).
    - ``update(stage, outputs)`` after each batch, with the step's outputs.
    - ``finish(pl_module, stage)`` at each epoch's end, where a subclass computes and logs.

    The sanity check's validation batches are neither updated nor finished: its numbers come from an untrained
    model and would be logged as the first validation's.

    Attributes:
        stages: the stages this callback accumulates (of ``keys.STAGES``); the others' hooks do nothing.
    """

    stages: tuple[str, ...] = keys.STAGES

    def start(self, pl_module: pl.LightningModule, stage: str) -> None:
        """Empty the stage's accumulators (and put them on the module's device)."""
        raise NotImplementedError

    def update(self, stage: str, outputs: Any) -> None:
        """Add one batch's step outputs to the stage's accumulators."""
        raise NotImplementedError

    def finish(self, pl_module: pl.LightningModule, stage: str) -> None:
        """Compute and log the stage's epoch values."""
        raise NotImplementedError

    def _start(self, pl_module: pl.LightningModule, stage: str) -> None:
        if stage in self.stages:
            self.start(pl_module, stage)

    def _update(self, stage: str, outputs: Any) -> None:
        if stage in self.stages:
            self.update(stage, outputs)

    def _finish(self, pl_module: pl.LightningModule, stage: str) -> None:
        if stage in self.stages:
            self.finish(pl_module, stage)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(pl_module, keys.TRAIN)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(pl_module, keys.TRAIN)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._update(keys.TRAIN, outputs)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(pl_module, keys.TRAIN)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(pl_module, keys.VAL)

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *batch_and_indices: Any
    ) -> None:
        if not trainer.sanity_checking:
            self._update(keys.VAL, outputs)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._finish(pl_module, keys.VAL)

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(pl_module, keys.TEST)

    def on_test_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *batch_and_indices: Any
    ) -> None:
        self._update(keys.TEST, outputs)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(pl_module, keys.TEST)

"""``ScheduleMonitor``: log the schedules of lambda and eta as training moves along them."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning import keys
from units_lightning.callbacks._shared import logging_step, step_values

__all__ = ["ScheduleMonitor"]


class ScheduleMonitor(Callback):
    """Log ``schedule/lambda`` (weight of vacuity in the task score) and ``schedule/eta`` (weight of the
    incorrect-belief regulariser) as Lightning's ``LearningRateMonitor`` logs the learning rate. The values are the
    ones the step used, read from the step outputs of ``UnitsMAML``.

    Works with any logger (the values go through ``LightningModule.log``); only at the logging steps
    (``log_every_n_steps``), so that the steps between cost nothing. A schedule the run does not use is left out:
    lambda under a sampler that ignores scores (``uses_scores``: MAML, Units-NTS), eta under a loss that ignores it
    (``uses_eta``: cross-entropy), so that a dashboard comparing methods draws no flat line for them.
    """

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        values = step_values(outputs, ("lam", "eta"), type(self).__name__)
        if not logging_step(trainer):
            return
        logged = {}
        if getattr(getattr(pl_module, "sampler", None), "uses_scores", True):
            logged[keys.SCHEDULE_LAMBDA] = float(values["lam"])
        if getattr(getattr(pl_module, "loss", None), "uses_eta", True):
            logged[keys.SCHEDULE_ETA] = float(values["eta"])
        if logged:
            pl_module.log_dict(logged, on_step=True, on_epoch=False)

"""``LabelBudget``: the label ledger over a fit: bound to the ranks at the start, its spending logged, training
stopped once the budget is spent, the sampler's declared counts checked."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning import keys
from units_lightning.callbacks._shared import logging_step
from units_lightning.collectives import sum_over_ranks

__all__ = ["LabelBudget"]


class LabelBudget(Callback):
    """Run the module's label ledger (``pl_module.ledger``, a ``LabelLedger``) through a fit.

    ``UnitsMAML`` adds one to every trainer (``configure_callbacks``). Under data-parallel training the ledger sums
    what every rank labeled. Before the first step (and the sanity check) it binds the ledger to this process's rank
    and refuses a label budget smaller than one meta-batch of every process, or one already spent by a restored
    checkpoint. At the logging steps it logs the labels spent (``labels/query_sets``, ``labels/query_images``,
    ``labels/support_images``) and checks that every mask held the number of query sets the sampler declared
    (``chosen_count``; one device read), again when training ends. It stops training once the budget is spent.

    The ledger stays the module's (``training_step`` reveals labels through it), and so does its place in
    checkpoints, ``label_ledger``: the module's checkpoint hooks run at every save and every load
    (``load_from_checkpoint``, ``test --ckpt_path``, weights-only saves), where Lightning calls a callback's only
    when ``fit`` saves a full checkpoint or resumes.
    """

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            pl_module.ledger.reduce = partial(sum_over_ranks, strategy=trainer.strategy)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meta_batch = getattr(getattr(pl_module, "sampler", None), "tasks", 1)
        pl_module.ledger.start(meta_batch, trainer.global_rank, trainer.world_size)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        ledger = pl_module.ledger
        if logging_step(trainer):  # asked before ``should_stop`` is set: that makes every step a logging step
            ledger.check_count(getattr(pl_module, "sampler", None))
            spent = {
                keys.LABELS_QUERY_SETS: float(ledger.query_sets),
                keys.LABELS_QUERY_IMAGES: float(ledger.query_images),
                keys.LABELS_SUPPORT_IMAGES: float(ledger.support_images),
            }
            pl_module.log_dict(spent, on_step=True, on_epoch=False)
        if ledger.exhausted:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.ledger.check_count(getattr(pl_module, "sampler", None))

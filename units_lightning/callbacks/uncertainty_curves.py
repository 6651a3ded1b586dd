"""``UncertaintyCurves``: validation accuracy against a vacuity threshold, at every validation epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from units_lightning.callbacks._shared import step_values, threshold_key
from units_lightning.metrics.functional import counts_to_curve, threshold_counts

__all__ = ["DEFAULT_VACUITY_THRESHOLDS", "UncertaintyCurves"]

DEFAULT_VACUITY_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class UncertaintyCurves(Callback):
    """At every validation epoch, log accuracy and coverage of the queries below each vacuity threshold.

    A confident model should be more accurate on the queries it is sure about: accuracy should fall as the
    threshold rises, towards plain accuracy at threshold 1, while coverage rises to 1. The paper reports
    accuracy at vacuity < 0.2 and < 0.1.

    Logged through ``LightningModule.log`` (any logger), in the same row as ``val/acc``:
    ``val_curve/acc_at_vacuity_<t>`` (NaN where no query is that sure) and ``val_curve/coverage_at_vacuity_<t>``,
    with ``<t>`` written without a dot (``0p20`` for 0.2). Counts are summed over ranks under data-parallel
    training. (No W&B table chart: tables are artifacts, and an offline run finished right after logging one
    lost its last history rows in wandb 0.31; ``units-lightning report`` draws the curve from these scalars.)

    Args:
        thresholds: vacuity thresholds in (0, 1].
    """

    def __init__(self, thresholds: Sequence[float] = DEFAULT_VACUITY_THRESHOLDS):
        values = sorted({float(t) for t in thresholds})
        if not values or not all(0.0 < t <= 1.0 for t in values):
            raise ValueError(f"thresholds must be a non-empty list of numbers in (0, 1], got {list(thresholds)}")
        if len({threshold_key(t) for t in values}) != len(values):
            raise ValueError(f"thresholds must differ in their first two decimals, got {values}")
        self.thresholds = tuple(values)
        self._counts = torch.zeros(2 * len(values) + 1, dtype=torch.float64)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._counts = torch.zeros(2 * len(self.thresholds) + 1, dtype=torch.float64)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking:
            return
        values = step_values(outputs, ("vacuity", "correct"), type(self).__name__)
        vacuity, correct = values["vacuity"].detach(), values["correct"].detach()
        kept, kept_correct = threshold_counts(correct, vacuity, torch.tensor(self.thresholds))
        self._counts += torch.cat([kept.cpu(), kept_correct.cpu(), torch.tensor([vacuity.numel()])]).double()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        counts = trainer.strategy.reduce(self._counts.to(pl_module.device, copy=True), reduce_op="sum").cpu()
        size = len(self.thresholds)
        total = float(counts[-1])
        if total == 0:
            return
        accuracy, coverage = counts_to_curve(counts[:size], counts[size : 2 * size], counts[-1])
        metrics = {}
        for threshold, acc, cov in zip(self.thresholds, accuracy.tolist(), coverage.tolist(), strict=True):
            metrics[f"val_curve/acc_at_vacuity_{threshold_key(threshold)}"] = acc
            metrics[f"val_curve/coverage_at_vacuity_{threshold_key(threshold)}"] = cov
        pl_module.log_dict(metrics, on_step=False, on_epoch=True)

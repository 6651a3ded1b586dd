"""``UncertaintyCurves``: validation accuracy against a vacuity threshold, at every validation epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

from units_lightning import keys
from units_lightning.callbacks._epoch_accumulator import EpochAccumulator
from units_lightning.callbacks._shared import step_values
from units_lightning.collectives import log_equal_on_every_rank
from units_lightning.metrics.uncertainty import synced_count
from units_lightning.metrics.vacuity_threshold import VacuityThresholdAccuracy

__all__ = ["UncertaintyCurves"]


class UncertaintyCurves(EpochAccumulator):
    """At every validation epoch, log accuracy and coverage of the queries below each vacuity threshold.

    A confident model should be more accurate on the queries it is sure about: accuracy should fall as the
    threshold rises, towards plain accuracy at threshold 1, while coverage rises to 1. The paper reports
    accuracy at vacuity < 0.2 and < 0.1.

    Logged through ``LightningModule.log`` (any logger), in the same row as ``val/acc``:
    ``val_curve/acc_vacuity_below_<t>`` (NaN where no query is that sure) and
    ``val_curve/coverage_vacuity_below_<t>``, with ``<t>`` written without a dot (``0p20`` for 0.2; names of
    ``units_lightning.keys``). The counts live in a ``units_lightning.metrics.VacuityThresholdAccuracy`` on the
    module's device and are summed over ranks under data-parallel training. (No W&B table chart: tables are
    artifacts, and an offline run finished right after logging one lost its last history rows in wandb 0.31;
    ``units-lightning report`` draws the curve from these scalars.)

    Args:
        thresholds: vacuity thresholds in (0, 1] (default ``keys.CURVE_VACUITY_THRESHOLDS``).
    """

    stages = (keys.VAL,)

    def __init__(self, thresholds: Sequence[float] = keys.CURVE_VACUITY_THRESHOLDS):
        values = sorted({float(t) for t in thresholds})
        if not values or not all(0.0 < t <= 1.0 for t in values):
            raise ValueError(f"thresholds must be a non-empty list of numbers in (0, 1], got {list(thresholds)}")
        if len({keys.threshold_suffix(t) for t in values}) != len(values):
            raise ValueError(f"thresholds must differ in their first two decimals, got {values}")
        self.thresholds = tuple(values)
        self._curve = VacuityThresholdAccuracy(self.thresholds)

    def start(self, pl_module: pl.LightningModule, stage: str) -> None:
        self._curve = self._curve.to(pl_module.device)  # where the ranks reduce (NCCL: the GPU)
        self._curve.reset()

    def update(self, stage: str, outputs: Any) -> None:
        values = step_values(outputs, ("vacuity", "correct"), type(self).__name__)
        self._curve.update(values["correct"], values["vacuity"])

    def finish(self, pl_module: pl.LightningModule, stage: str) -> None:
        if synced_count(self._curve, "total") == 0:  # every rank: the count is summed across them
            return
        accuracy, coverage = self._curve.compute()
        self._curve.reset()
        metrics = {}
        for threshold, acc, cov in zip(self.thresholds, accuracy.tolist(), coverage.tolist(), strict=True):
            metrics[keys.stage_key(keys.VAL_CURVE, keys.acc_vacuity_below(threshold))] = acc
            metrics[keys.stage_key(keys.VAL_CURVE, keys.coverage_vacuity_below(threshold))] = cov
        log_equal_on_every_rank(pl_module, metrics, on_step=False, on_epoch=True)  # counts summed across ranks

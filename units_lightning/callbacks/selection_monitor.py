"""``SelectionMonitor``: what the task sampler chose, what it passed over, and what the labels bought."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from units_lightning import keys
from units_lightning.callbacks._shared import step_values, wandb_loggers
from units_lightning.collectives import log_equal_on_every_rank

__all__ = ["SelectionMonitor"]


class SelectionMonitor(Callback):
    """Log the uncertainty of chosen vs rejected query sets, how often each slot wins, and the label-budget curve.

    Once per training epoch, over the steps where the sampler used the task scores (after its warm-up):

    * ``selection/uncertainty_chosen_p<q>`` and ``selection/uncertainty_rejected_p<q>``: quantiles (percent) of
      the task uncertainty of the chosen and of the rejected candidate query sets; with W&B also the full
      distributions as histograms ``selection/uncertainty_chosen_hist`` and ``selection/uncertainty_rejected_hist``
      (the step means ``selection/uncertainty_{chosen,rejected}`` are logged by ``UnitsMAML``);
    * ``selection/slot_win/<i>``: fraction of tasks whose query set in slot ``i`` was labeled. The candidate
      sets of a task are drawn alike, so under uncertainty-driven selection every slot should win about
      equally often; a slot that always wins points to ties or a positional bias.

    At every validation, ``label_budget/query_sets``: the query sets labeled so far, logged in the same row as
    ``val/acc`` so that ``val/acc`` against it is the label-budget curve of the paper's Figure 4.

    Every value goes through ``LightningModule.log`` (any logger); under data-parallel training the
    scores of all ranks are gathered first.

    Args:
        quantiles: which quantiles of the chosen and rejected uncertainties to log, in (0, 1).
        histogram_bins: bins of the W&B histograms.
    """

    def __init__(self, quantiles: Sequence[float] = (0.1, 0.5, 0.9), histogram_bins: int = 32):
        if not quantiles or not all(0.0 < q < 1.0 for q in quantiles):
            raise ValueError(f"quantiles must be a non-empty list of numbers in (0, 1), got {list(quantiles)}")
        if histogram_bins < 1:
            raise ValueError(f"histogram_bins must be >= 1, got {histogram_bins}")
        self.quantiles = tuple(float(q) for q in quantiles)
        self.histogram_bins = histogram_bins
        self._scores: list[Tensor] = []
        self._chosen: list[Tensor] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scores, self._chosen = [], []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        values = step_values(outputs, ("scores", "chosen", "scored"), type(self).__name__)
        if values["scored"]:
            self._scores.append(values["scores"].detach().float())
            self._chosen.append(values["chosen"].detach())

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._scores:  # warm-up or a sampler that ignores scores (ranks agree: it depends on the step only)
            return
        scores, chosen = torch.cat(self._scores), torch.cat(self._chosen)
        if trainer.world_size > 1:
            scores = pl_module.all_gather(scores).flatten(0, 1)
            chosen = pl_module.all_gather(chosen).flatten(0, 1)
        self._scores, self._chosen = [], []
        finite = scores.isfinite()  # a step skipped as non-finite has no scores to rank
        chosen_values, rejected_values = scores[chosen & finite], scores[~chosen & finite]
        metrics = {keys.slot_win(slot): float(win) for slot, win in enumerate(chosen.float().mean(dim=0))}
        for name, values in (("chosen", chosen_values), ("rejected", rejected_values)):
            if values.numel():
                levels = torch.quantile(values.cpu().double(), torch.tensor(self.quantiles, dtype=torch.float64))
                for q, level in zip(self.quantiles, levels, strict=True):
                    metrics[keys.selection_quantile(name, round(100 * q))] = float(level)
        # From the scores of every rank (gathered above): the same on each.
        log_equal_on_every_rank(pl_module, metrics, on_step=False, on_epoch=True)
        self._log_histograms(trainer, chosen_values, rejected_values)

    def _log_histograms(self, trainer: pl.Trainer, chosen_values: Tensor, rejected_values: Tensor) -> None:
        loggers = wandb_loggers(trainer)
        if not loggers:
            return
        import numpy as np
        import wandb

        both = torch.cat([chosen_values, rejected_values]).cpu().double().numpy()
        if both.size == 0:
            return
        low, high = float(both.min()), float(both.max())
        if high <= low:
            high = low + 1e-6
        metrics = {}
        for name, values in (("chosen", chosen_values), ("rejected", rejected_values)):
            if values.numel():  # shared bins, so that the two histograms line up
                counts = np.histogram(values.cpu().double().numpy(), bins=self.histogram_bins, range=(low, high))
                metrics[keys.selection_histogram(name)] = wandb.Histogram(np_histogram=counts)
        for logger in loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ledger = getattr(pl_module, "ledger", None)
        if trainer.sanity_checking or ledger is None:
            return
        spent = {keys.LABEL_BUDGET_QUERY_SETS: float(ledger.query_sets)}  # the ledger counts every rank's labels
        log_equal_on_every_rank(pl_module, spent, on_step=False, on_epoch=True)

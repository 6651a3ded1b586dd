"""``NonFiniteGuard``: a step whose meta-loss or gradients are not finite is never applied."""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from units_lightning import keys

__all__ = ["NonFiniteGuard"]


class NonFiniteGuard(Callback):
    """Skip (or stop at) an optimizer step whose meta-loss or gradients are not finite, before it is applied.

    ``UnitsMAML`` adds one to every trainer with its ``non_finite`` option. A skipped step's gradients are set to
    None, so Adam leaves the weights and its state (moments, step count) untouched; the step is counted in the
    module's label ledger (``skipped_steps``; its labels stay counted, once), logged as ``train/skipped_steps`` and
    warned about the first time. The check costs one device-to-host read of one bool per optimizer step (plus,
    under data-parallel training, one all-reduce of one number, so that every rank decides alike).

    Args:
        mode: "skip" (count the step and go on) or "stop" (raise ``FloatingPointError`` naming the step).
    """

    def __init__(self, mode: Literal["skip", "stop"] = "skip"):
        if mode not in ("skip", "stop"):
            raise ValueError(f"non_finite must be 'skip' or 'stop', got {mode!r}")
        self.mode = mode
        self._loss: Tensor | None = None  # of the optimizer step being taken
        self._finite: Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loss = self._finite = None

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        # Every (micro-)batch of the coming optimizer step must be finite; kept on the device, not read here.
        finite = torch.isfinite(loss.detach())
        self._finite = finite if self._finite is None else self._finite & finite
        self._loss = loss.detach()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = self._finite if self._finite is not None else torch.ones((), dtype=torch.bool)
        if grads:  # the largest magnitude of each gradient: inf or nan where any entry is
            largest = torch.stack(torch._foreach_norm(grads, float("inf")))
            finite = finite.to(largest.device) & largest.isfinite().all()
        if trainer.world_size > 1:
            finite = trainer.strategy.reduce((~finite).float(), reduce_op="sum") == 0
        applied = bool(finite)  # the one device-to-host read of the check
        loss, self._loss, self._finite = self._loss, None, None
        ledger = pl_module.ledger
        spent = ledger.close_step(applied)
        pl_module.log(keys.TRAIN_SKIPPED_STEPS, float(ledger.skipped_steps), on_step=True, on_epoch=False)
        if applied:
            return
        what = "meta-loss" if loss is not None and not bool(torch.isfinite(loss)) else "gradients"
        value = "" if loss is None else f" ({float(loss)})" if what == "meta-loss" else f" (loss {float(loss):.4g})"
        advice = "lower model.lr, model.inner_lr or the peak of model.eta"
        if self.mode == "stop":
            raise FloatingPointError(
                f"non-finite {what}{value} at step {trainer.global_step}: {advice}; checkpoints already written are "
                f"intact (label ledger: {ledger}); model.non_finite=skip skips such steps instead"
            )
        optimizer.zero_grad(set_to_none=True)
        if ledger.skipped_steps == 1:
            rank_zero_warn(
                f"non-finite {what}{value} at step {trainer.global_step}: the step was skipped, not applied (its "
                f"{spent} labeled query sets stay counted, once). Later skips are counted in "
                f"{keys.TRAIN_SKIPPED_STEPS} and the fit summary without a warning. If they repeat, {advice}; "
                "model.non_finite=stop stops instead"
            )

"""``NonFiniteGuard``: a step whose meta-loss or gradients are not finite is never applied."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from units_lightning import keys
from units_lightning.callbacks._shared import logging_step
from units_lightning.collectives import sum_over_ranks

__all__ = ["NonFiniteGuard"]

_ADVICE = "lower model.lr, model.inner_lr or the peak of model.eta"


class NonFiniteGuard(Callback):
    """Skip (or stop at) an optimizer step whose meta-loss or gradients are not finite, before it is applied.

    ``UnitsMAML`` adds one to every trainer with its ``non_finite`` option. A skipped step leaves the weights and
    Adam's state (moments, step count) untouched; it is counted in the module's label ledger (``skipped_steps``; its
    labels stay counted, once), logged as ``train/skipped_steps`` and warned about the first time.

    How a step is skipped depends on the optimizer:

    * a fused optimizer (``UnitsMAML`` uses fused Adam on CUDA) takes the decision on the device: the finiteness flag
      goes to the optimizer as ``found_inf``, as ``torch.amp.GradScaler`` does, and the fused kernel leaves weights
      and state alone when it is set. Nothing is read back per step: the skipped steps are counted on the device and
      read at the logging steps (``log_every_n_steps``), at checkpoints and at the end of training;
    * any other optimizer (Adam on the CPU, where a read costs nothing): one device-to-host read of one bool per
      step, and a skipped step's gradients are set to None.

    "stop" always reads the flag at every step, so that it stops at the bad step itself. Under data-parallel training
    the flag is summed across ranks (one all-reduce of one number, on the device) so that every rank decides alike.

    Args:
        mode: "skip" (count the step and go on) or "stop" (raise ``FloatingPointError`` naming the step).
    """

    def __init__(self, mode: Literal["skip", "stop"] = "skip"):
        if mode not in ("skip", "stop"):
            raise ValueError(f"non_finite must be 'skip' or 'stop', got {mode!r}")
        self.mode = mode
        self._reset()

    def _reset(self) -> None:
        self._loss: Tensor | None = None  # of the optimizer step being taken
        self._finite: Tensor | None = None
        # Counted on the device (fused optimizers): skipped steps, their query sets and the first one's step and loss.
        self._pending: Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

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
            finite = sum_over_ranks((~finite).float(), trainer.strategy) == 0  # queued: no barrier, no wait
        loss, self._loss, self._finite = self._loss, None, None
        if self.mode == "skip" and optimizer.defaults.get("fused"):
            self._skip_on_device(trainer, pl_module, optimizer, finite, loss)
        else:
            self._skip_on_host(trainer, pl_module, optimizer, bool(finite), loss)  # the one read of the check

    def _skip_on_device(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: torch.optim.Optimizer,
        finite: Tensor,
        loss: Tensor | None,
    ) -> None:
        skipped = (~finite).to(torch.float32).reshape(1)
        optimizer.found_inf = skipped[0]  # the fused kernel applies nothing, and undoes its step count, when set
        spent = pl_module.ledger.close_step(applied=True)  # this step's labels; counted as skipped below if it was
        if self._pending is None:  # skipped steps, their query sets; the first one's step, loss and query sets
            self._pending = torch.zeros(5, device=skipped.device)
            self._pending[2:4] = float("nan")
        loss_value = loss.float().reshape(1) if loss is not None else torch.full_like(skipped, float("nan"))
        step = torch.full_like(skipped, float(trainer.global_step))  # a fill: torch.tensor would wait for the GPU
        counted = self._pending[:2] + torch.cat([skipped, skipped * spent])
        first = torch.cat([step, loss_value, skipped * spent])
        is_first = self._pending[2].isnan() & (skipped[0] > 0)
        self._pending = torch.cat([counted, torch.where(is_first, first, self._pending[2:])])
        if logging_step(trainer):
            self.settle(trainer, pl_module)

    def _skip_on_host(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: torch.optim.Optimizer,
        applied: bool,
        loss: Tensor | None,
    ) -> None:
        ledger = pl_module.ledger
        spent = ledger.close_step(applied)
        if logging_step(trainer):
            pl_module.log(keys.TRAIN_SKIPPED_STEPS, float(ledger.skipped_steps), on_step=True, on_epoch=False)
        if applied:
            return
        what = "meta-loss" if loss is not None and not bool(torch.isfinite(loss)) else "gradients"
        if self.mode == "stop":
            raise FloatingPointError(
                f"non-finite {what}{_loss_text(what, loss)} at step {trainer.global_step}: {_ADVICE}; checkpoints "
                f"already written are intact (label ledger: {ledger}); model.non_finite=skip skips such steps instead"
            )
        optimizer.zero_grad(set_to_none=True)
        if ledger.skipped_steps == 1:
            _warn_first(what, loss, trainer.global_step, spent)

    def settle(self, trainer: pl.Trainer, pl_module: pl.LightningModule, log: bool = True) -> None:
        """Move the skipped steps counted on the device into the ledger (one read), log their count (with ``log``, at
        a logging step), warn the first time. Called at logging steps, before checkpoints and at the end of training
        (hooks where Lightning allows no logging)."""
        if self._pending is None:
            return
        steps, query_sets, first_step, first_loss, first_sets = self._pending.tolist()
        self._pending = None
        ledger = pl_module.ledger
        before = ledger.skipped_steps
        ledger.record_skipped(int(steps), int(query_sets))
        if log and logging_step(trainer):
            pl_module.log(keys.TRAIN_SKIPPED_STEPS, float(ledger.skipped_steps), on_step=True, on_epoch=False)
        if before == 0 and ledger.skipped_steps > 0:
            what = "gradients" if torch.isfinite(torch.tensor(first_loss)) else "meta-loss"
            _warn_first(what, torch.tensor(first_loss), int(first_step), int(first_sets))

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.settle(trainer, pl_module, log=False)  # before the module writes its ledger into the checkpoint

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.settle(trainer, pl_module, log=False)


def _loss_text(what: str, loss: Tensor | None) -> str:
    if loss is None:
        return ""
    return f" ({float(loss)})" if what == "meta-loss" else f" (loss {float(loss):.4g})"


def _warn_first(what: str, loss: Tensor | None, step: int, spent: int) -> None:
    rank_zero_warn(
        f"non-finite {what}{_loss_text(what, loss)} at step {step}: the step was skipped, not applied (its {spent} "
        f"labeled query sets stay counted, once). Later skips are counted in {keys.TRAIN_SKIPPED_STEPS} and the fit "
        f"summary without a warning. If they repeat, {_ADVICE}; model.non_finite=stop stops instead"
    )

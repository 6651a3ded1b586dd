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
_SETTLE_AFTER = 1000
"""Steps after which the flags held on the device are read back even where no logging step came (a run that logs
rarely): what is held per step until then is its flag and its losses, two tiny tensors on the device."""


def non_finite_flag(tensors: list[Tensor], one: Tensor) -> Tensor:
    """A 0-d float32 tensor on ``one``'s device: 1 where any entry of ``tensors`` is inf or nan, else 0.

    One fused kernel over all of them on CUDA and the CPU (``torch.amp.GradScaler``'s check, unscaling by ``one``,
    which leaves every value as it is; elsewhere, e.g. MPS, each tensor's largest magnitude), and nothing read back:
    the flag can go to a fused optimizer as ``found_inf``.
    """
    if tensors and one.device.type not in ("cuda", "cpu"):
        return _largest_not_finite(tensors).to(one.device)
    flag = torch.zeros((), dtype=torch.float32, device=one.device)
    if tensors:
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, flag, one)
    return flag


def _largest_not_finite(tensors: list[Tensor]) -> Tensor:
    """The flag from each tensor's largest magnitude (inf or nan exactly where an entry is): any device."""
    largest = torch.stack([m.float() for m in torch._foreach_norm(tensors, float("inf"))])
    return largest.isfinite().all().logical_not().float()


class NonFiniteGuard(Callback):
    """Skip (or stop at) an optimizer step whose meta-loss or gradients are not finite, before it is applied.

    ``UnitsMAML`` adds one to every trainer with its ``non_finite`` option. A skipped step leaves the weights and
    Adam's state (moments, step count) untouched; it is counted in the module's label ledger (``skipped_steps``; its
    labels stay counted, once), logged as ``train/skipped_steps`` and warned about the first time.

    How a step is skipped depends on the optimizer:

    * a fused optimizer (``UnitsMAML`` uses fused Adam on CUDA) takes the decision on the device: the finiteness flag
      goes to the optimizer as ``found_inf``, as ``torch.amp.GradScaler`` does, and the fused kernel leaves weights
      and state alone when it is set. Nothing is read back per step: the steps' flags stay on the device and are
      read together at the logging steps (``log_every_n_steps``), at checkpoints and at the end of training;
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
        self._losses: list[Tensor] = []  # of the optimizer step being taken (one per micro-batch)
        # Steps not read yet (fused optimizers): per step its number, its non-finite flag on the device, its last loss
        # (a copy: a step replayed as a CUDA graph overwrites its loss at the next replay) and its query sets.
        self._pending: list[tuple[int, Tensor, Tensor | None, int]] = []
        self._one: Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        self._losses.append(loss.detach())  # every (micro-)batch of the coming optimizer step must be finite

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        losses = torch.stack([loss.reshape(()) for loss in self._losses]) if self._losses else None
        self._losses = []
        device = grads[0].device if grads else losses.device if losses is not None else pl_module.device
        if self._one is None or self._one.device != device:
            self._one = torch.ones((), dtype=torch.float32, device=device)
        flag = non_finite_flag([*grads, *([losses] if losses is not None else [])], self._one)
        if trainer.world_size > 1:  # 1 on every rank where any rank saw a non-finite value
            flag = sum_over_ranks(flag, trainer.strategy).clamp_(max=1)  # queued: no barrier, no wait
        loss = losses[-1] if losses is not None else None
        if self.mode == "skip" and optimizer.defaults.get("fused"):
            self._skip_on_device(trainer, pl_module, optimizer, flag, loss)
        else:
            self._skip_on_host(trainer, pl_module, optimizer, not bool(flag), loss)  # the one read of the check

    def _skip_on_device(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: torch.optim.Optimizer,
        flag: Tensor,
        loss: Tensor | None,
    ) -> None:
        optimizer.found_inf = flag  # the fused kernel applies nothing, and undoes its step count, when it is 1
        spent = pl_module.ledger.close_step(applied=True)  # this step's labels; counted as skipped at settle if it was
        self._pending.append((trainer.global_step, flag, loss, spent))
        if logging_step(trainer):
            self.settle(trainer, pl_module)
        elif len(self._pending) >= _SETTLE_AFTER:
            self.settle(trainer, pl_module, log=False)

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
        """Move the skipped steps among those held into the ledger (one read of their flags from the device), log
        their count (with ``log``, at a logging step), warn the first time. Called at logging steps, every
        ``_SETTLE_AFTER`` steps, before checkpoints and at the end of training (hooks where Lightning allows no
        logging)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flags = torch.stack([flag for _, flag, _, _ in pending]).tolist()
        skipped = [entry for entry, flag in zip(pending, flags, strict=True) if flag]
        ledger = pl_module.ledger
        before = ledger.skipped_steps
        ledger.record_skipped(len(skipped), sum(spent for *_, spent in skipped))
        if log and logging_step(trainer):
            pl_module.log(keys.TRAIN_SKIPPED_STEPS, float(ledger.skipped_steps), on_step=True, on_epoch=False)
        if before == 0 and skipped:
            step, _, loss, spent = skipped[0]
            what = "meta-loss" if loss is not None and not bool(torch.isfinite(loss)) else "gradients"
            _warn_first(what, loss, step, spent)

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

"""``SummaryWriter``: the summary of every ``fit`` (``summary.json``), from the command line or from Python."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger

from units_lightning import keys
from units_lightning.callbacks.collapse_monitor import CollapseMonitor
from units_lightning.runs import SUMMARY, run_directory

__all__ = ["SummaryWriter", "fit_summary"]

_SUMMARY_KEYS = {
    "val_accuracy": keys.stage_key(keys.VAL, keys.ACC),
    "val_accuracy_ci95": keys.stage_key(keys.VAL, keys.ACC_CI95),
    **{f"val_{name}": keys.stage_key(keys.VAL, name) for name in keys.BELIEFS},
}


class SummaryWriter(Callback):
    """After ``fit``, write ``fit_summary`` as ``summary.json`` into the run directory and, with a W&B logger, into
    the W&B run's summary (``summary/<key>``).

    ``units-lightning fit`` adds one to every run and prints the summary; from Python, ``trainer.fit`` with one
    writes the same file. A fit resumed from a checkpoint that trains no step (it is where the configuration stops)
    writes nothing: the run's summary stays as it was. Only rank zero writes; with several ``SummaryWriter`` in one
    trainer, the first does the work.

    Args:
        output_dir: where to write (default: the run directory, beside ``config.yaml`` and ``checkpoints/``).

    Attributes:
        summary: the summary written by the last ``fit`` (None until one trained a step).
        path: the file written (None likewise).
    """

    def __init__(self, output_dir: str | None = None):
        self.output_dir = output_dir
        self.summary: dict[str, Any] | None = None
        self.path: Path | None = None
        self._started = 0.0
        self._start_step: int | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._started, self._start_step = time.perf_counter(), None
            self.summary = self.path = None

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]):
        self._start_step = int(checkpoint.get("global_step", 0))  # the step a resumed fit starts from

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        first = next(c for c in trainer.callbacks if isinstance(c, SummaryWriter))
        if first is not self or not trainer.is_global_zero:
            return
        if self._start_step is not None and trainer.global_step == self._start_step:
            return  # resumed where it stops: nothing trained, nothing to add to the run's summary
        wall_time = time.perf_counter() - self._started
        summary = fit_summary(trainer, pl_module, wall_time, self._start_step or 0)
        directory = Path(self.output_dir) if self.output_dir is not None else run_directory(trainer)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SUMMARY
        path.write_text(json.dumps(summary, indent=2) + "\n")
        if isinstance(trainer.logger, WandbLogger):
            trainer.logger.experiment.summary.update(
                {f"summary/{k}": v for k, v in summary.items() if not isinstance(v, dict)}
            )
        self.summary, self.path = summary, path


def fit_summary(trainer: pl.Trainer, model: Any, wall_time_s: float, start_step: int = 0) -> dict[str, Any]:
    """Final validation metrics, labels spent, steps and wall time of a finished ``fit``; why it stopped when the
    label budget ended it, the steps skipped as non-finite, the ``CollapseMonitor`` warning if one was given (with
    its step, ``collapse_step``), and the checkpoints written (paths relative to the run folder).

    Args:
        trainer: the trainer that ran ``fit``.
        model: the ``UnitsMAML`` it trained (its ``ledger`` and ``n_way`` are read).
        wall_time_s: seconds the fit took.
        start_step: the step a resumed fit started from (0 for a new run): ``wall_time_s`` covers the steps after it.
    """
    metrics = trainer.callback_metrics
    summary: dict[str, Any] = {}
    for name, key in _SUMMARY_KEYS.items():
        value = float(metrics[key]) if key in metrics else math.nan
        summary[name] = None if math.isnan(value) else round(value, 6)
    summary.update(
        labels=model.ledger.state_dict(),
        steps=int(trainer.global_step),
        wall_time_s=round(wall_time_s, 2),
        start_step=int(start_step),
        chance_accuracy=round(1.0 / model.n_way, 6),
    )
    ledger = model.ledger
    monitors = [c for c in trainer.callbacks if isinstance(c, CollapseMonitor)]
    warned = next((c for c in monitors if c.warning), None)  # its diagnosis: the options that fix it
    summary.update(
        stopped=f"label budget of {ledger.budget} query sets reached" if ledger.exhausted else None,
        skipped_steps=ledger.skipped_steps,
        collapse_warning=None if warned is None else warned.warning,
        collapse_step=None if warned is None else warned.step,
        collapse_diagnosis=None if warned is None else warned.diagnosis,
        checkpoints=_checkpoints_written(trainer, run_directory(trainer)),
    )
    return summary


def _checkpoints_written(trainer: pl.Trainer, folder: Path) -> dict[str, str]:
    """``{"best": ..., "last": ...}``: the best by the monitored metric and the newest, relative to ``folder``."""
    found: dict[str, str] = {}
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint) or not callback.best_model_path:
            continue
        role = "best" if callback.monitor else "last"
        path = Path(callback.best_model_path if callback.monitor else callback.last_model_path or "")
        if role == "last" and not path.is_file():
            path = Path(callback.best_model_path)
        with contextlib.suppress(ValueError):
            path = path.resolve().relative_to(folder.resolve())
        found.setdefault(role, str(path))
    return found

"""What ``units-lightning fit`` says when it ends: the summary (``summary.json`` and its printed form) and the files
it wrote, with the commands that come next."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger

from units_lightning import keys
from units_lightning.callbacks import CollapseMonitor
from units_lightning.runs import SUMMARY, config_file_name, run_directory

__all__ = ["fit_summary", "format_summary", "is_offline", "written_files"]

_SUMMARY_KEYS = {
    "val_accuracy": keys.stage_key(keys.VAL, keys.ACC),
    "val_accuracy_ci95": keys.stage_key(keys.VAL, keys.ACC_CI95),
    **{f"val_{name}": keys.stage_key(keys.VAL, name) for name in keys.BELIEFS},
}


def fit_summary(trainer: pl.Trainer, model: Any, wall_time_s: float, start_step: int = 0) -> dict[str, Any]:
    """Final validation metrics, labels spent, steps and wall time of a finished ``fit``; why it stopped when the
    label budget ended it, the steps skipped as non-finite, the ``CollapseMonitor`` warning if one was given, and
    the checkpoints written (paths relative to the run folder).

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
    warnings_given = [c.warning for c in trainer.callbacks if isinstance(c, CollapseMonitor) and c.warning]
    summary.update(
        stopped=f"label budget of {ledger.budget} query sets reached" if ledger.exhausted else None,
        skipped_steps=ledger.skipped_steps,
        collapse_warning=warnings_given[0] if warnings_given else None,
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


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as printed: accuracy with its CI, the four beliefs, labels spent, steps, why it stopped."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    labels = summary["labels"]
    ci = summary.get("val_accuracy_ci95")
    accuracy = pct(summary["val_accuracy"]) + (f" +- {100 * ci:.2f}" if ci is not None else "")
    steps, seconds, start = summary["steps"], f"{summary['wall_time_s']:.1f} s", summary.get("start_step") or 0
    # a resumed run: the seconds are this command's, for the steps after the checkpoint
    timing = f"(resumed at step {start}: {steps - start} steps in {seconds})" if start else f"in {seconds}"
    lines = [
        "units-lightning fit summary",
        f"  validation accuracy  {accuracy} (95% CI over the validation tasks; chance "
        f"{pct(summary['chance_accuracy'])})",
        f"  vacuity {num(summary['val_vacuity'])} | dissonance {num(summary['val_dissonance'])} | "
        f"incorrect belief {num(summary['val_incorrect_belief'])} | "
        f"correct belief {num(summary['val_correct_belief'])}",
        f"  labels spent         {labels['query_sets']} query sets, {labels['query_images']} query images, "
        f"{labels['support_images']} support images",
        f"  steps {steps} {timing}",
    ]
    if summary.get("stopped"):
        lines.append(f"  stopped: {summary['stopped']}")
    if summary.get("skipped_steps"):
        lines.append(
            f"  skipped steps        {summary['skipped_steps']} (non-finite loss or gradients, not applied; their "
            f"{labels.get('skipped_query_sets', 0)} labeled query sets are counted above)"
        )
    if summary.get("collapse_warning"):
        lines.append(f"  warning: {summary['collapse_warning']}")
    return "\n".join(lines)


def written_files(folder: Path, summary: dict[str, Any], logger: Any, configs: list[str]) -> str:
    """The files of a finished ``fit``, and what to run next (``configs``: the ``--config`` and root options that
    find the run again)."""
    lines = [f"written to {folder}{os.sep}"]
    for role, path in summary.get("checkpoints", {}).items():
        why = "best by val/acc: `--ckpt_path best`" if role == "best" else "the newest: `--ckpt_path last` resumes"
        lines.append(f"  {path:<36} {why}")
    lines.append(f"  {SUMMARY}, {config_file_name('fit')}")
    if isinstance(logger, WandbLogger) and logger._experiment is not None:
        run = logger.experiment
        if is_offline(run):
            offline = Path(run.dir).parent
            lines.append(f"  W&B offline run: {offline} (`wandb sync` uploads it)")
        elif getattr(run, "url", None):
            lines.append(f"  W&B run {run.url}")
    config = " ".join(configs) or "--config <the same config>"
    lines.append(f"next: units-lightning test {config} --ckpt_path best")
    lines.append(f"      units-lightning report {folder}")
    return "\n".join(lines)


def is_offline(run: Any) -> bool:
    """Whether a W&B run writes only to disk (``WandbLogger(offline=True)`` gives mode ``dryrun``)."""
    return bool(getattr(run, "offline", False)) or getattr(run.settings, "mode", None) in ("offline", "dryrun")

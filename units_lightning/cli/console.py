"""What ``units-lightning`` prints: the quiet display (one line per validation, Lightning's and W&B's notices
hidden), and the fit summary with the files written and the commands that come next."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.loggers import WandbLogger

from units_lightning.lazy import import_object
from units_lightning.runs import SUMMARY, config_file_name

__all__ = [
    "PROGRESS_MODES",
    "format_summary",
    "is_offline",
    "quiet",
    "replayed_options",
    "wants_progress",
    "written_files",
]

PROGRESS_MODES = ("validation", "steps")
# Noise for a reader, hidden unless --progress steps: the data is decoded in memory, so loader workers would not
# help; a deprecation inside Lightning itself; and, for `predict` (no logger, no checkpointing), Lightning's notes
# that the checkpoint callbacks' folder moved and that a list of batches has no sampler indices.
_QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*isinstance.treespec, LeafSpec.*",
    r".*The dirpath has changed from.*",
    r".*Couldn't infer the batch indices fetched from your dataloader.*",
)
_QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric")
# Options of `fit` that the `test` it suggests must not repeat: it names its own checkpoint.
_NOT_REPLAYED = ("--ckpt_path", "--print_config")


def quiet(undo: contextlib.ExitStack) -> None:
    """Hide what a reader of one line per validation does not need: Lightning's notices (GPU/TPU lines, the
    seed, the model summary, tips), W&B's banner, and warnings that are noise here. ``undo`` restores it all when
    it closes."""
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        level = logger.level
        logger.setLevel(logging.WARNING)
        undo.callback(logger.setLevel, level)
    undo.enter_context(warnings.catch_warnings())
    for message in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    if "WANDB_SILENT" not in os.environ:
        os.environ["WANDB_SILENT"] = "true"
        undo.callback(os.environ.pop, "WANDB_SILENT", None)


def wants_progress(config: Namespace) -> bool:
    """Whether a subcommand's config gets ``ValidationProgress``: the quiet display, a progress bar enabled, and
    no progress bar of the config's own choosing."""
    if config.get("progress", "validation") != "validation":
        return False
    trainer = config.get("trainer")
    if trainer is None or trainer.get("enable_progress_bar") is False:
        return False
    callbacks = trainer.get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        class_path = callback.get("class_path") if isinstance(callback, Namespace) else None
        with contextlib.suppress(ImportError, AttributeError, ValueError):
            if issubclass(import_object(str(class_path)), ProgressBar):
                return False  # the config chose its own display
    return True


def replayed_options(words: list[str]) -> list[str]:
    """The options of a ``fit`` command line that the next command repeats: all of them (the ``--config`` files,
    the data root, the logger and root folders, every model, data and trainer override), so that the ``test`` it
    suggests finds the same data and the same run, less ``--ckpt_path`` and ``--print_config``."""
    kept: list[str] = []
    skip_value = False
    for word in words:
        if skip_value:
            skip_value = False
            if not word.startswith("-"):
                continue
        option, has_value, _ = word.partition("=")
        if option in _NOT_REPLAYED:
            skip_value = not has_value
            continue
        kept.append(word)
    return kept


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


def written_files(folder: Path, summary: dict[str, Any], logger: Any, options: list[str]) -> str:
    """The files of a finished ``fit``, and what to run next (``options``: those of the ``fit`` command line that
    the next command repeats, from ``replayed_options``), quoted for a shell so that it runs as printed."""
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
    given = shlex.join(options) if options else "--config <the same config>"
    # without validation (--trainer.limit_val_batches 0) no checkpoint is best by val/acc: the test takes the last
    checkpoint = "best" if "best" in summary.get("checkpoints", {}) else "last"
    lines.append(f"next: units-lightning test {given} --ckpt_path {checkpoint}")
    lines.append(f"      units-lightning report {shlex.quote(str(folder))}")
    return "\n".join(lines)


def is_offline(run: Any) -> bool:
    """Whether a W&B run writes only to disk (``WandbLogger(offline=True)`` gives mode ``dryrun``)."""
    return bool(getattr(run, "offline", False)) or getattr(run.settings, "mode", None) in ("offline", "dryrun")

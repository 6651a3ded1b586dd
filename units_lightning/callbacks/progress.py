"""``ValidationProgress``: a quiet progress display, one line per validation with its accuracy and beliefs, and on a
terminal a heartbeat between validations."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress import ProgressBar

from units_lightning import keys

__all__ = ["HEARTBEAT_S", "ValidationProgress", "heartbeat_line", "validation_line"]

HEARTBEAT_S = 30.0  # the most often the heartbeat speaks between validations

_BELIEF_WORDS = {
    "vacuity": "vacuity",
    "dissonance": "dissonance",
    "incorrect_belief": "incorrect belief",
    "correct_belief": "correct belief",
}


def _value(metrics: dict[str, Any], key: str) -> float | None:
    if key not in metrics:
        return None
    value = float(metrics[key])
    return None if math.isnan(value) else value


def validation_line(
    metrics: dict[str, Any], step: int, max_steps: int | None, elapsed_s: float, stage: str = keys.VAL
) -> str:
    """One line of a validation's results: step, accuracy with its 95% CI, the four beliefs, the query sets labeled
    so far, the seconds since training started.

    Args:
        metrics: the logged values (``trainer.callback_metrics``), as numbers or one-element tensors.
        step: the training step validated at.
        max_steps: the steps the run will take, or None where unknown.
        elapsed_s: seconds since training started.
        stage: the logged prefix (``val``).

    >>> validation_line({"val/acc": 0.9, "val/acc_ci95": 0.02, "val/vacuity": 0.4}, 50, 300, 12.3)
    'step 50/300  val acc 90.00% +- 2.00  vacuity 0.400  labeled n/a  12 s'
    """
    accuracy = _value(metrics, keys.stage_key(stage, keys.ACC))
    ci = _value(metrics, keys.stage_key(stage, keys.ACC_CI95))
    parts = [f"step {step}/{max_steps}" if max_steps else f"step {step}"]
    if accuracy is None:
        parts.append(f"{stage} acc n/a")
    else:
        parts.append(f"{stage} acc {100 * accuracy:.2f}%" + (f" +- {100 * ci:.2f}" if ci is not None else ""))
    for name, word in _BELIEF_WORDS.items():
        value = _value(metrics, keys.stage_key(stage, name))
        if value is not None:
            parts.append(f"{word} {value:.3f}")
    labeled = _value(metrics, keys.LABEL_BUDGET_QUERY_SETS)  # SelectionMonitor: at each validation
    if labeled is None:
        labeled = _value(metrics, keys.LABELS_QUERY_SETS)  # the module, at its logging steps
    parts.append("labeled n/a" if labeled is None else f"labeled {int(labeled)}")
    parts.append(f"{elapsed_s:.0f} s")
    return "  ".join(parts)


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``: a remaining time as a person reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def heartbeat_line(step: int, max_steps: int | None, steps_per_s: float, elapsed_s: float) -> str:
    """One line between validations: the step, the training speed, the seconds since training started and the
    time left at that speed (no ETA where the length or the speed is unknown).

    Args:
        step: the global step reached.
        max_steps: the step the run stops at, or None where unknown.
        steps_per_s: steps per second since training (or this resumed segment) started.
        elapsed_s: seconds since training started.

    >>> heartbeat_line(60, 300, 2.0, 30.0)
    'step 60/300  2.00 steps/s  30 s elapsed  ETA 2 min'
    """
    parts = [f"step {step}/{max_steps}" if max_steps else f"step {step}", f"{steps_per_s:.2f} steps/s"]
    parts.append(f"{elapsed_s:.0f} s elapsed")
    if max_steps and steps_per_s > 0 and step < max_steps:
        parts.append(f"ETA {_duration((max_steps - step) / steps_per_s)}")
    return "  ".join(parts)


class ValidationProgress(ProgressBar):
    """Progress for a person: a line when training starts, one per validation, one when testing starts.

    Lightning's own bar redraws at every step (hundreds of lines in a log file); this prints only what a reader
    follows, each line complete. ``units-lightning`` uses it by default (``--progress steps`` brings Lightning's bar
    back, ``--trainer.enable_progress_bar false`` shows neither). Reads the logged values once per validation.

    Between validations, when the stream is a terminal, a heartbeat (``heartbeat_line``: step, steps/s, elapsed,
    ETA) comes once ``heartbeat_s`` have passed without a line, so that a long first epoch is not silence; a CI
    log or a pipe gets none (it would only lengthen the log).

    Args:
        stream: where to print (default ``sys.stdout``).
        heartbeat_s: the least seconds between the heartbeat and the line before it; 0 switches it off.
        clock: the seconds clock (default ``time.monotonic``; tests pass a fake).
        isatty: whether the stream is a terminal (default: asked of the stream when a heartbeat is due).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
        isatty: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self._enabled = True
        self._stream = stream
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._isatty = isatty
        self._started = clock()
        self._last_line = self._started
        self._first_step = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``trainer.print`` goes here: printed whole, on its own line."""
        if self._enabled:
            print(*args, **{"file": self._stream or sys.stdout, "flush": True, **kwargs})
            self._last_line = self._clock()

    def _say(self, trainer: pl.Trainer, text: str) -> None:
        if trainer.is_global_zero:
            self.print(text)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = self._clock()
        total = self._max_steps(trainer)
        first = self._first_step = trainer.global_step
        every = trainer.val_check_batch if trainer.enable_validation else None
        plan = f"training from step {first}" if first else "training"
        plan += f" to step {total}" if total else ""
        if isinstance(every, int | float) and not math.isinf(every):
            plan += f", validating every {int(every)} steps"
        self._say(trainer, plan + " (validation accuracy +- its 95% CI, mean beliefs, query sets labeled, seconds)")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """The heartbeat, when due and the stream is a terminal."""
        if not self._heartbeat_s or not self._enabled or not trainer.is_global_zero:
            return
        now = self._clock()
        if now - self._last_line < self._heartbeat_s or not self._on_terminal():
            return
        elapsed = now - self._started
        rate = (trainer.global_step - self._first_step) / elapsed if elapsed > 0 else 0.0
        self.print(heartbeat_line(trainer.global_step, self._max_steps(trainer), rate, elapsed))

    def _on_terminal(self) -> bool:
        if self._isatty is not None:
            return self._isatty()
        isatty = getattr(self._stream or sys.stdout, "isatty", None)
        try:
            return bool(isatty()) if callable(isatty) else False
        except (OSError, ValueError):  # a closed or detached stream
            return False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        line = validation_line(trainer.callback_metrics, trainer.global_step, self._max_steps(trainer), self._elapsed())
        self._say(trainer, line)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = self._clock()
        self._say(trainer, f"testing on {self._batches(trainer.num_test_batches)} batches of tasks")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = self._clock()
        self._say(trainer, f"predicting {self._batches(trainer.num_predict_batches)} batches")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "validate" and not trainer.sanity_checking:
            self._started = self._clock()
            self._say(trainer, f"validating on {self._batches(trainer.num_val_batches)} batches of tasks")

    def _elapsed(self) -> float:
        return self._clock() - self._started

    @staticmethod
    def _batches(counts: Any) -> str:
        counts = [c for c in (counts or []) if isinstance(c, int | float) and not math.isinf(c)]
        return str(int(sum(counts))) if counts else "all"

    @staticmethod
    def _max_steps(trainer: pl.Trainer) -> int | None:
        try:
            steps = trainer.estimated_stepping_batches
        except Exception:  # e.g. an endless loader and no max_steps: the run says when it stops
            return None
        return None if steps is None or math.isinf(steps) else int(steps)

"""Ctrl-C on ``fit`` stops as SIGTERM does: at the end of the current step, with ``last.ckpt`` saved there, and the
command says how to resume.

Left to Lightning, SIGINT raises ``KeyboardInterrupt`` wherever the process is (in the middle of a meta-gradient,
of an optimizer step), the trainer shuts down without a checkpoint and the command exits with status 1 and
nothing said. ``StopOnInterrupt`` turns the first Ctrl-C into Lightning's own SIGTERM flag
(``trainer.received_sigterm``): ``CheckpointOnSigterm`` saves ``last.ckpt`` at the end of that step and Lightning
raises ``SIGTERMException`` at the step boundary. A second Ctrl-C interrupts at once, as Python's default does.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import lightning.pytorch as pl

__all__ = ["StopOnInterrupt"]


class StopOnInterrupt:
    """While entered, the first SIGINT asks ``trainer`` to stop at the end of its step (Lightning's SIGTERM path);
    ``interrupted`` says afterwards whether it came. Outside the main thread (where signals cannot be handled) it
    does nothing."""

    interrupted = False  # the last command's: read by the entry point to say "Ctrl-C" rather than "SIGTERM"

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self._previous: Any = None

    def __enter__(self) -> StopOnInterrupt:
        StopOnInterrupt.interrupted = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        StopOnInterrupt.interrupted = True
        self.trainer._signal_connector.received_sigterm = True  # what Lightning's SIGTERM handler sets
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once

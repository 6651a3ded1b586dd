"""Helpers the callbacks share: reading step outputs, knowing the logging steps and reaching W&B loggers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger


def step_values(outputs: Any, keys: Iterable[str], callback: str) -> Mapping[str, Any]:
    """The step outputs a callback reads, with a clear error when the module does not return them.

    Raises:
        TypeError: if ``outputs`` is not a mapping holding every key (the callbacks read ``UnitsMAML``'s step dicts).
    """
    missing = [key for key in keys if not isinstance(outputs, Mapping) or key not in outputs]
    if missing:
        raise TypeError(
            f"{callback} reads the step outputs of UnitsMAML, but the step returned no {', '.join(missing)}: "
            "use it with units_lightning.UnitsMAML (or a subclass that returns the same dict)"
        )
    return outputs


def logging_step(trainer: pl.Trainer | None) -> bool:
    """Whether values logged now reach the loggers: every ``log_every_n_steps`` steps (and on the last step). What
    is logged only then costs nothing on the other steps: no logging call, no device-to-host read."""
    return trainer is not None and trainer._logger_connector.should_update_logs


def wandb_loggers(trainer: pl.Trainer) -> list[WandbLogger]:
    """The trainer's W&B loggers (there may be other loggers beside them)."""
    return [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]

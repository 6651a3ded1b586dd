"""Schedules for the task-selection weight lambda and the regulariser weight eta.

A schedule is a small callable object evaluated on a (fractional) epoch count ``E``. The module
passes ``E = trainer.current_epoch`` (counted from 0), or ``global_step / steps_per_epoch`` when its
``schedule_steps_per_epoch`` is set (the paper's label-budget setting counts an epoch every 100
iterations). Counting from 0 means the first epoch trains with ``eta = 0`` under ``LinearWarmup``:
evidential training collapses to all-vacuous outputs when the regulariser is strong from the start.
"""

from __future__ import annotations

__all__ = ["Constant", "LinearAnneal", "LinearWarmup", "Schedule"]


class Schedule:
    """A value as a function of the epoch count ``E`` (a float, counted from 0)."""

    def __call__(self, epoch: float) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(Schedule):
    """The same value at every epoch.

    Example:
        >>> Constant(0.5)(12)
        0.5
    """

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self, epoch: float) -> float:
        return self.value


class LinearAnneal(Schedule):
    """``start - (start - end) * min(1, E / epochs)``: the paper's lambda, 0.99 -> 0.5 over 50 epochs.

    Args:
        start: value at epoch 0.
        end: value from ``epochs`` on.
        epochs: length of the ramp in epochs, > 0.

    Example:
        >>> lam = LinearAnneal(start=0.99, end=0.5, epochs=50)
        >>> lam(0), round(lam(25), 3), lam(80)
        (0.99, 0.745, 0.5)
    """

    def __init__(self, start: float = 0.99, end: float = 0.5, epochs: float = 50):
        if epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {epochs}")
        self.start, self.end, self.epochs = float(start), float(end), float(epochs)

    def __call__(self, epoch: float) -> float:
        return self.start - (self.start - self.end) * min(1.0, max(0.0, epoch) / self.epochs)


class LinearWarmup(Schedule):
    """``min(peak, peak * E / epochs)``: the paper's eta, e.g. ``min(2, 0.2 E)`` with peak 2, 10 epochs.

    Args:
        peak: value reached at ``epochs`` and kept after.
        epochs: length of the ramp in epochs, > 0.

    Example:
        >>> eta = LinearWarmup(peak=2.0, epochs=10)
        >>> eta(0), eta(5), eta(30)
        (0.0, 1.0, 2.0)
    """

    def __init__(self, peak: float = 2.0, epochs: float = 10):
        if epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {epochs}")
        self.peak, self.epochs = float(peak), float(epochs)

    def __call__(self, epoch: float) -> float:
        return self.peak * min(1.0, max(0.0, epoch) / self.epochs)

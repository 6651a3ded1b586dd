"""``RunningMeans``: weighted means of per-step values, kept on the device until they are logged."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RunningMeans"]


class RunningMeans:
    """Weighted means over the steps of an epoch of values that not every step has, without any device read.

    ``update`` adds a step's values (0-d tensors) times the step's weight with one stacked addition per set of
    names, so that a training step costs two small kernels instead of one logging call per value; ``compute`` merges
    the sums into one mean per name (a name is averaged over the steps that had it).

    Example:
        >>> means = RunningMeans()
        >>> means.update({"a": torch.tensor(1.0)}, weight=1)
        >>> means.update({"a": torch.tensor(4.0), "b": torch.tensor(2.0)}, weight=2)
        >>> {k: round(float(v), 4) for k, v in means.compute().items()}
        {'a': 3.0, 'b': 2.0}
    """

    def __init__(self) -> None:
        self._sums: dict[tuple[str, ...], tuple[Tensor, float]] = {}

    def update(self, values: dict[str, Tensor], weight: float) -> None:
        names = tuple(values)
        step = torch.stack([v.detach().float() for v in values.values()]) * weight
        total, weights = self._sums.get(names, (torch.zeros_like(step), 0.0))
        self._sums[names] = (total + step, weights + weight)

    def compute(self) -> dict[str, Tensor]:
        """The mean of every name seen since the last ``reset`` (empty if none, or if every weight was 0)."""
        return {name: total / weight for name, (total, weight) in self.totals().items() if weight > 0}

    def totals(self) -> dict[str, tuple[Tensor, float]]:
        """Each name's sum of value x weight and sum of weights since the last ``reset``: what processes add up to
        the means of all their steps (``collectives.weighted_means_over_ranks``)."""
        sums: dict[str, Tensor] = {}
        weights: dict[str, float] = {}
        for names, (total, weight) in self._sums.items():
            for name, value in zip(names, total.unbind(), strict=True):
                sums[name] = sums[name] + value if name in sums else value
                weights[name] = weights.get(name, 0.0) + weight
        return {name: (sums[name], weights[name]) for name in sums}

    def reset(self) -> None:
        self._sums = {}

"""``TheoremOneCheck``: on how many tasks Theorem 1 (``ib_t >= cb_t / 2``) holds, and its smallest slack."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from units_lightning.belief import theorem_one_margin

__all__ = ["TheoremOneCheck"]


class TheoremOneCheck(Metric):
    """Fraction of tasks where Theorem 1 holds, and the smallest slack ``min_t (ib_t - cb_t / 2)``.

    States are the count of holding tasks and of tasks (summed across processes) and the smallest margin
    (minimised across processes), so under data-parallel evaluation every process computes the global values.

    Args:
        atol: rounding slack: a task counts as holding when ``ib_t >= cb_t / 2 - atol`` (the bound is tight for
            two equal beliefs, where float rounding can land either side).

    Example:
        >>> metric = TheoremOneCheck()
        >>> metric.update(torch.tensor([[0.4, 0.2], [0.3, 0.1]]), torch.tensor([[0.8, 0.4], [0.2, 0.0]]))
        >>> holds, margin = metric.compute()
        >>> float(holds), round(float(margin), 4)
        (1.0, 0.0)
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, atol: float = 1e-6, **kwargs) -> None:
        super().__init__(**kwargs)
        if atol < 0:
            raise ValueError(f"atol must be >= 0, got {atol}")
        self.atol = atol
        self.add_state("holds", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("tasks", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("margin", default=torch.tensor(float("inf"), dtype=torch.float64), dist_reduce_fx="min")

    def update(self, incorrect_belief: Tensor, dissonance: Tensor) -> None:
        """Add tasks: (T, M) incorrect belief and dissonance of the M queries of T tasks.

        Tasks whose beliefs are not finite (a training step skipped as non-finite) are left out: the theorem is
        about beliefs, and such a task has none.
        """
        margin = theorem_one_margin(incorrect_belief.detach(), dissonance.detach()).to(torch.float64)
        if margin.numel() == 0:
            return
        finite = margin.isfinite()  # kept on the device: no read back per step
        self.holds += ((margin >= -self.atol) & finite).sum()
        self.tasks += finite.sum()
        self.margin = torch.minimum(self.margin, torch.where(finite, margin, torch.inf).min())

    def compute(self) -> tuple[Tensor, Tensor]:
        """(fraction of tasks where the theorem holds, smallest margin); ``nan`` and ``inf`` before any task."""
        tasks = self.tasks.to(torch.float64)
        return torch.where(tasks > 0, self.holds / tasks.clamp_min(1), torch.nan), self.margin

"""The label ledger: the one place where query labels are read, and the count of what was labeled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from units_lightning.episode import TaskBatch

__all__ = ["LabelLedger"]


def _same(counts: Tensor) -> Tensor:
    return counts


class LabelLedger:
    """Reveals the labels of chosen query sets and counts every label the learner consumed.

    Support sets are labeled by assumption (the inner loop needs them), so the support images of every
    adapted task count. Query labels are revealed only for the query sets the sampler chose; the labels of
    the other query sets are never read, so they cannot influence training.

    Under data-parallel training each rank reveals its own labels; ``reduce`` (set by the module to a sum
    over ranks) makes every rank's ledger count the labels of all ranks, so the budget is global.

    Args:
        budget: optional number of labeled query sets after which training should stop (the paper's
            label-budget setting uses 10,000).

    Attributes:
        support_images: labeled support images used so far.
        query_images: labeled query images revealed so far.
        query_sets: labeled query sets revealed so far.
        reduce: sums a tensor of counts over ranks (identity by default).
    """

    def __init__(self, budget: int | None = None):
        if budget is not None and budget < 1:
            raise ValueError(f"label budget must be >= 1 query set or None, got {budget}")
        self.budget = budget
        self.support_images = 0
        self.query_images = 0
        self.query_sets = 0
        self.reduce: Callable[[Tensor], Tensor] = _same

    def reveal(self, batch: TaskBatch, chosen: Tensor) -> Tensor:
        """Labels of the chosen query sets, in row-major order of ``chosen``; counts this step's labels.

        Args:
            batch: the batch whose sealed query labels to open (all its support sets count as labeled).
            chosen: (T, Q) bool mask of the query sets to label.

        Returns:
            (number chosen, n_way * query_shots) labels.

        Raises:
            ValueError: if ``chosen`` does not match the batch's query sets.
        """
        if chosen.shape != batch.query_y.shape[:2] or chosen.dtype != torch.bool:
            raise ValueError(
                f"chosen must be a bool mask of shape {tuple(batch.query_y.shape[:2])}, "
                f"got {chosen.dtype} {tuple(chosen.shape)}"
            )
        labels = batch.query_y._labels[chosen.to(batch.query_y._labels.device)]
        counts = torch.tensor([batch.support_y.numel(), labels.numel(), labels.shape[0]], device=labels.device)
        support_images, query_images, query_sets = (int(c) for c in self.reduce(counts))
        self.support_images += support_images
        self.query_images += query_images
        self.query_sets += query_sets
        return labels

    @staticmethod
    def evaluation_labels(batch: TaskBatch) -> Tensor:
        """All query labels of an evaluation batch, (T, Q, M). Never call this on training batches:
        evaluation labels are not spent from the budget and must not reach a gradient."""
        return batch.query_y._labels

    @property
    def exhausted(self) -> bool:
        """True once the budget of labeled query sets is spent."""
        return self.budget is not None and self.query_sets >= self.budget

    def state_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "support_images": self.support_images,
            "query_images": self.query_images,
            "query_sets": self.query_sets,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.support_images = int(state["support_images"])
        self.query_images = int(state["query_images"])
        self.query_sets = int(state["query_sets"])

    def __repr__(self) -> str:
        return (
            f"LabelLedger(query_sets={self.query_sets}, query_images={self.query_images}, "
            f"support_images={self.support_images}, budget={self.budget})"
        )

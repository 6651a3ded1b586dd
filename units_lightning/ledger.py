"""The label ledger: the one place where query labels are read, and the count of what was labeled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from units_lightning.episode import TaskBatch

__all__ = ["LabelLedger", "Revealed", "chosen_indices"]


def _same(counts: Tensor) -> Tensor:
    return counts


class Revealed(NamedTuple):
    """The labels ``LabelLedger.reveal`` opened: (n, M) labels of n query sets, and each set's task and set index."""

    labels: Tensor
    task_index: Tensor
    set_index: Tensor


def chosen_indices(chosen: Tensor, count: int | None = None) -> tuple[Tensor, Tensor]:
    """Task and set index of every query set a (T, Q) mask holds, in row-major order.

    With ``count``, the number of sets the mask holds, nothing is read from the device (a stable sort puts the
    chosen sets first, in order); without it, one ``nonzero``.
    """
    if count is None:
        return chosen.nonzero(as_tuple=True)
    flat = chosen.flatten().to(torch.uint8)
    index = torch.sort(flat, descending=True, stable=True).indices[:count]
    sets = chosen.shape[1]
    return torch.div(index, sets, rounding_mode="floor"), index % sets


class LabelLedger:
    """Reveals the labels of chosen query sets and counts every label the learner consumed.

    Support sets are labeled by assumption (the inner loop needs them), so the support images of every
    adapted task count. Query labels are revealed only for the query sets the sampler chose; the labels of
    the other query sets are never read, so they cannot influence training.

    Under data-parallel training each rank reveals its own labels; ``reduce`` (set by the module to a sum
    over ranks) makes every rank's ledger count the labels of all ranks, so the budget is global.

    The budget is never exceeded. ``within_budget`` trims a step's choice to what is left: the last step labels
    only the query sets left of the budget, the chosen sets of highest priority first (the most uncertain, when
    the step scored them; else task by task). Under data-parallel training what is left is split by rank without
    any communication: with ``L`` sets left and ``W`` ranks, rank ``r`` may label ``L // W`` sets, plus one if
    ``r < L % W``; every rank computes the same split from the global count. Training is over
    (``exhausted``) once fewer sets are left than there are ranks, so that no rank runs a step with nothing to
    label (under ``W`` ranks the budget may end up to ``W - 1`` sets short; on one process it is spent exactly).
    ``reveal`` refuses a choice larger than this rank's share, so no code path can overspend.

    A meta-update that was computed but not applied (non-finite loss or gradients) still spent its labels: they
    stay counted, once, and ``close_step(applied=False)`` records them in ``skipped_steps`` and
    ``skipped_query_sets``.

    Args:
        budget: optional number of labeled query sets after which training should stop (the paper's
            label-budget setting uses 10,000).

    Attributes:
        support_images: labeled support images used so far.
        query_images: labeled query images revealed so far.
        query_sets: labeled query sets revealed so far.
        skipped_steps: meta-updates skipped (not applied) after their labels were revealed.
        skipped_query_sets: labeled query sets of those skipped steps (already in ``query_sets``).
        reduce: sums a tensor of counts over ranks (identity by default).
        rank, world_size: this process's rank and the number of ranks sharing the budget (set by ``start``).
    """

    def __init__(self, budget: int | None = None):
        if budget is not None and budget < 1:
            raise ValueError(f"label budget must be >= 1 query set or None, got {budget}")
        self.budget = budget
        self.support_images = 0
        self.query_images = 0
        self.query_sets = 0
        self.skipped_steps = 0
        self.skipped_query_sets = 0
        self.reduce: Callable[[Tensor], Tensor] = _same
        self.rank, self.world_size = 0, 1
        self._unsettled = 0  # query sets revealed since the last optimizer step was closed
        self._miscounted: Tensor | bool = False  # a mask held another count than its sampler declared

    def start(self, meta_batch: int, rank: int = 0, world_size: int = 1) -> None:
        """Bind the ledger to this process's rank and check the budget before the first step.

        Args:
            meta_batch: query sets one step labels on one process (the sampler's ``tasks``).
            rank: this process's rank; world_size: the number of processes sharing the budget.

        Raises:
            ValueError: if the budget is smaller than one meta-batch of all processes, or already spent (a
                checkpoint of a finished budget run).
        """
        self.rank, self.world_size = rank, world_size
        self._unsettled, self._miscounted = 0, False
        if self.budget is None:
            return
        per_step = meta_batch * world_size
        if self.budget < per_step:
            fewer = (
                f"lower the sampler's tasks (data.sampler.init_args.tasks) to at most {self.budget // world_size}"
                if self.budget >= world_size
                else f"train on at most {self.budget} processes"
            )
            raise ValueError(
                f"label budget of {self.budget} query sets is smaller than one meta-batch: each step labels "
                f"{per_step} query sets ({meta_batch} tasks x {world_size} process{'es' if world_size > 1 else ''}). "
                f"Raise model.label_budget to at least {per_step}, or {fewer}"
            )
        self._refuse_if_spent()

    def _refuse_if_spent(self) -> None:
        if self.exhausted:
            assert self.budget is not None
            raise ValueError(
                f"the label budget of {self.budget} query sets is spent: {self.query_sets} are labeled already "
                f"(a checkpoint of a finished budget run?), {self.budget - self.query_sets} left for "
                f"{self.world_size} process{'es' if self.world_size > 1 else ''}. Raise model.label_budget to train "
                "further"
            )

    @property
    def share(self) -> int | None:
        """Query sets this rank may still label (its part of what is left of the budget); None without a budget."""
        if self.budget is None:
            return None
        left = max(self.budget - self.query_sets, 0)
        return left // self.world_size + (1 if self.rank < left % self.world_size else 0)

    def within_budget(self, chosen: Tensor, priority: Tensor | None = None, count: int | None = None) -> Tensor:
        """``chosen`` trimmed to this rank's share of what is left of the budget (unchanged while it fits).

        Reads nothing from the device while the whole mask (or its declared ``count``) fits the share; near the end
        of a budget, one ``nonzero``. Keeps the chosen sets of highest ``priority`` (ties and ``priority=None``: in
        row-major order, task by task).

        Args:
            chosen: (T, Q) bool mask of the query sets the sampler chose.
            priority: (T, Q) scores, higher first (the step's task uncertainty), or None.
            count: how many sets ``chosen`` holds, when the sampler declares it (``TaskSampler.chosen_count``).

        Raises:
            ValueError: if the budget is already spent.
        """
        share = self.share
        if share is None or (chosen.numel() if count is None else count) <= share:
            return chosen
        self._refuse_if_spent()
        flat = chosen.flatten()
        picked = flat.nonzero().squeeze(1)  # row-major
        if picked.numel() <= share:
            return chosen
        if priority is not None:
            order = torch.sort(priority.flatten()[picked], descending=True, stable=True).indices
            picked = picked[order]
        kept = torch.zeros_like(flat)
        kept[picked[:share]] = True
        return kept.view_as(chosen)

    def reveal(self, batch: TaskBatch, chosen: Tensor, count: int | None = None) -> Revealed:
        """Labels of the chosen query sets, in row-major order of ``chosen``, with where they are; counts them.

        With ``count`` (the number of sets ``chosen`` holds, declared by the sampler) nothing is read from the
        device and, under data-parallel training, nothing is communicated: every rank chose ``count`` sets, trimmed
        to its share of the budget, which every rank knows. The declaration is checked on the device and read at
        ``check_count``. Without ``count``: one ``nonzero`` and, across ranks, one sum of the counts.

        Args:
            batch: the batch whose sealed query labels to open (all its support sets count as labeled).
            chosen: (T, Q) bool mask of the query sets to label (after ``within_budget``).
            count: how many sets the sampler declared it chose (``TaskSampler.chosen_count``), or None.

        Returns:
            ``Revealed``: the (n, n_way * query_shots) labels and the task and set index of each of the n sets.

        Raises:
            ValueError: if ``chosen`` does not match the batch's query sets, or holds more query sets than this
                rank's share of the budget (pass it through ``within_budget`` first).
        """
        count = self.record(batch, chosen, count)
        return self.open_chosen(batch.query_y._labels, chosen, count)

    def record(self, batch: TaskBatch, chosen: Tensor, count: int | None = None) -> int | None:
        """Count the labels of the chosen query sets without opening them (``reveal`` is ``record``, then
        ``open_chosen``; a training step captured as a CUDA graph opens them inside the graph and records outside).

        Arguments and errors as ``reveal``.

        Returns:
            the number of sets the step labels on this rank when it was declared (``count`` trimmed to this rank's
            share of the budget), else None.
        """
        if chosen.shape != batch.query_y.shape[:2] or chosen.dtype != torch.bool:
            raise ValueError(
                f"chosen must be a bool mask of shape {tuple(batch.query_y.shape[:2])}, "
                f"got {chosen.dtype} {tuple(chosen.shape)}"
            )
        share, declared = self.share, count
        per_set = batch.query_y.shape[2:].numel()
        if count is not None:
            count = min(count, share) if share is not None else count
            self._miscounted = self._miscounted | (chosen.sum() != count)  # read by check_count, not here
            # every rank labels min(count, its share): known everywhere without communication
            query_sets = sum(self._planned(declared, rank) for rank in range(self.world_size))
            support_images, query_images = batch.support_y.numel() * self.world_size, query_sets * per_set
        else:
            wanted = int(chosen.sum())
            if share is not None and wanted > share:
                raise ValueError(
                    f"chosen holds {wanted} query sets but only {share} are left of the label budget of "
                    f"{self.budget} on this process: trim the mask with LabelLedger.within_budget before revealing"
                )
            counts = torch.tensor([batch.support_y.numel(), wanted * per_set, wanted], device=chosen.device)
            support_images, query_images, query_sets = (int(c) for c in self.reduce(counts))
        self.support_images += support_images
        self.query_images += query_images
        self.query_sets += query_sets
        self._unsettled += query_sets
        return count

    @staticmethod
    def open_chosen(labels: Tensor, chosen: Tensor, count: int | None = None) -> Revealed:
        """The labels of the chosen query sets, in row-major order, with their task and set index; counts nothing.

        Only for a caller that counts the same choice with ``record`` (``reveal`` does both); reads nothing from the
        device when ``count`` is given.

        Args:
            labels: (T, Q, M) the batch's sealed query labels.
            chosen: (T, Q) bool mask; count: how many sets it holds (as ``record`` returned it), or None.
        """
        task_index, set_index = chosen_indices(chosen, count)
        opened = labels[task_index.to(labels.device), set_index.to(labels.device)]
        return Revealed(opened, task_index, set_index)

    def _planned(self, count: int, rank: int) -> int:
        """Sets that ``rank`` labels this step when every rank's sampler chose ``count``: trimmed to its share."""
        if self.budget is None:
            return count
        left = max(self.budget - self.query_sets, 0)
        return min(count, left // self.world_size + (1 if rank < left % self.world_size else 0))

    def check_count(self, sampler: object) -> None:
        """Raise if a step's mask held another number of query sets than the sampler declared (one device read).

        Raises:
            ValueError: naming the sampler and the fix.
        """
        if bool(self._miscounted):
            raise ValueError(
                f"{sampler!r} declared in chosen_count() how many query sets it chooses per step, but a step's mask "
                "held another number: the labels counted and trained on would be wrong. Make chosen_count() return "
                "the size of the mask that select() returns, or None to have it counted from the mask"
            )

    def close_step(self, applied: bool) -> int:
        """Close an optimizer step; when it was not ``applied``, record it and its labeled query sets as skipped.

        The labels stay counted once in ``query_sets`` either way: they were read.

        Returns:
            the query sets labeled (over every rank) since the previous ``close_step``.
        """
        spent, self._unsettled = self._unsettled, 0
        if not applied:
            self.record_skipped(1, spent)
        return spent

    def record_skipped(self, steps: int, query_sets: int) -> None:
        """Count ``steps`` meta-updates that were not applied, with their ``query_sets`` (already in ``query_sets``)."""
        self.skipped_steps += steps
        self.skipped_query_sets += query_sets

    @staticmethod
    def evaluation_labels(batch: TaskBatch) -> Tensor:
        """All query labels of an evaluation batch, (T, Q, M). Never call this on training batches:
        evaluation labels are not spent from the budget and must not reach a gradient."""
        return batch.query_y._labels

    @property
    def exhausted(self) -> bool:
        """True once the budget of labeled query sets is spent: fewer sets are left than there are ranks (on one
        process: none left)."""
        return self.budget is not None and self.budget - self.query_sets < self.world_size

    def state_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "support_images": self.support_images,
            "query_images": self.query_images,
            "query_sets": self.query_sets,
            "skipped_steps": self.skipped_steps,
            "skipped_query_sets": self.skipped_query_sets,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.support_images = int(state["support_images"])
        self.query_images = int(state["query_images"])
        self.query_sets = int(state["query_sets"])
        self.skipped_steps = int(state.get("skipped_steps", 0))  # checkpoints before skipping was counted
        self.skipped_query_sets = int(state.get("skipped_query_sets", 0))

    def __repr__(self) -> str:
        return (
            f"LabelLedger(query_sets={self.query_sets}, query_images={self.query_images}, "
            f"support_images={self.support_images}, budget={self.budget})"
        )

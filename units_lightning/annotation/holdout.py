"""The labeled query sets of an annotation project held out for validation, and their evaluation episodes.

A share ``val_share`` of the labeled query sets validates ``fit`` instead of training it. Which ones is decided by
the order in which they arrived in the label store (ingested batch parts, oldest first; within a part, in an order
shuffled by the seed) and a phase drawn from the seed: set number ``i`` is held out where
``floor(share * (i + 1) + phase) > floor(share * i + phase)``, one in every ``1 / share``. The store only grows at the
end, so a set keeps its role from one round to the next: a set trained on is never validated on later, and the
held-out sets of round 1 are still held out in round 5. The phase lies in ``[0, 1 - share)``, so the first labeled
set always trains and the first held-out one comes with the ``labels_needed``-th labeled set.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from torch.utils.data import Dataset

from units_lightning.annotation.label_store import LabelStore
from units_lightning.data.datasets.images import FewShotImages
from units_lightning.data.episodic import build_batch
from units_lightning.episode import EpisodeIndices, TaskBatch

__all__ = [
    "HeldOutEpisodes",
    "HeldOutSet",
    "arrival_order",
    "check_share",
    "held_out_flags",
    "held_out_sets",
    "labels_needed",
    "validation_phase",
]


def check_share(share: float) -> None:
    """Refuse a share outside ``(0, 1)``: nothing to hold out, or nothing left to train on."""
    if not 0 < share < 1:
        raise ValueError(f"the held-out share must lie in (0, 1), got {share}")


def validation_phase(share: float, seed: int) -> float:
    """The seed's phase of the held-out pattern, in ``[0, 1 - share)``: where in every ``1 / share`` sets the
    held-out one falls."""
    check_share(share)
    return float(np.random.default_rng([seed, 0x5A17]).random()) * (1 - share)


def held_out_flags(count: int, share: float, phase: float) -> np.ndarray:
    """Which of ``count`` query sets, in arrival order, are held out: ``floor(share * count + phase)`` of them, each
    set's role fixed by its position alone.

    Example:
        >>> held_out_flags(10, 0.2, 0.5).nonzero()[0].tolist()
        [2, 7]
    """
    position = np.arange(count)
    return np.floor(share * (position + 1) + phase) > np.floor(share * position + phase)


def labels_needed(share: float, phase: float) -> int:
    """The number of labeled query sets at which the first one is held out.

    Example:
        >>> labels_needed(0.2, 0.5)
        3
    """
    check_share(share)
    count = max(1, math.ceil((1 - phase) / share) - 1)
    while not held_out_flags(count, share, phase).any():  # the formula, guarded against rounding
        count += 1
    return count


def arrival_order(store: LabelStore, seed: int) -> list[tuple[str, ...]]:
    """Every labeled query set's images, oldest ingested part first, each part's sets shuffled by ``seed`` (a
    batch lists its sets most uncertain first: unshuffled, the held-out ones would be the same rank of every batch)."""
    ordered = []
    for number, part in enumerate(store.batches):
        order = np.random.default_rng([seed, 0x5A17, number]).permutation(len(part.query_sets))
        ordered += [part.query_sets[i].images for i in order]
    return ordered


def held_out_sets(store: LabelStore, share: float, seed: int) -> tuple[set[tuple[str, ...]], int, int]:
    """The labeled query sets held out for validation (by their images), how many sets are labeled, and how many are
    needed for the first held-out one (``labels_needed``)."""
    ordered = arrival_order(store, seed)
    phase = validation_phase(share, seed)
    flags = held_out_flags(len(ordered), share, phase)
    held = {images for images, flag in zip(ordered, flags, strict=True) if flag}
    return held, len(ordered), labels_needed(share, phase)


@dataclass(frozen=True)
class HeldOutSet:
    """A held-out query set as indices into the project's training images.

    Attributes:
        task: the task's name.
        classes: (n_way,) ids of its task's classes among the images' classes.
        support: one array of the task's support image indices per class.
        query: (M,) the query set's image indices.
        labels: (M,) their class positions, in ``0 .. n_way - 1``.
    """

    task: str
    classes: np.ndarray
    support: tuple[np.ndarray, ...]
    query: np.ndarray
    labels: np.ndarray


def held_out_episode(held: HeldOutSet, rng: np.random.Generator, k_shot: int) -> EpisodeIndices:
    """One evaluation task: ``k_shot`` support images per class drawn from the task's support set, in shuffled
    order, and the held-out query set as its single query set."""
    n_way = len(held.classes)
    labels = np.repeat(np.arange(n_way), k_shot)
    order = rng.permutation(labels.size)
    support = np.concatenate([rng.choice(pool, size=k_shot, replace=False) for pool in held.support])
    return EpisodeIndices(
        held.classes[None], support[order][None], labels[order][None], held.query[None, None], held.labels[None, None]
    )


class HeldOutEpisodes(Dataset):
    """Item ``i`` holds evaluation tasks ``i * tasks_per_item ...`` of ``tasks`` (this process's share of the
    held-out sets), each drawn from a generator seeded by (seed, 1, its number): the same support images at every
    validation of a fit, and in every round."""

    def __init__(
        self,
        images: FewShotImages,
        held_out: Sequence[HeldOutSet],
        k_shot: int,
        seed: int,
        tasks_per_item: int,
        tasks: Collection[int] | None = None,
    ):
        self.images, self.held_out, self.k_shot, self.seed = images, list(held_out), k_shot, seed
        self.tasks_per_item = tasks_per_item
        self.tasks = list(tasks) if tasks is not None else list(range(len(self.held_out)))

    def __len__(self) -> int:
        return -(-len(self.tasks) // self.tasks_per_item)

    def __getitem__(self, index: int) -> TaskBatch:
        if not 0 <= index < len(self):
            raise IndexError(f"evaluation batch {index} out of range: {len(self)} batches")
        numbers = self.tasks[index * self.tasks_per_item : (index + 1) * self.tasks_per_item]
        parts = [
            held_out_episode(self.held_out[n], np.random.default_rng([self.seed, 1, n]), self.k_shot) for n in numbers
        ]
        indices = EpisodeIndices(
            *(
                np.concatenate([getattr(p, f) for p in parts])
                for f in ("classes", "support", "support_labels", "query", "query_labels")
            )
        )
        return build_batch(self.images, indices, step=index)

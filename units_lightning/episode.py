"""What a training step receives: a batch of tasks, with query labels sealed away."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

__all__ = ["EpisodeIndices", "EpisodeSpec", "SealedLabels", "TaskBatch"]


@dataclass(frozen=True)
class EpisodeSpec:
    """Shape of one task: ``n_way`` classes, ``k_shot`` support and ``query_shots`` query images each."""

    n_way: int
    k_shot: int
    query_shots: int

    def __post_init__(self) -> None:
        for name in ("n_way", "k_shot", "query_shots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def images_per_class(self) -> int:
        return self.k_shot + self.query_shots


@dataclass
class EpisodeIndices:
    """Image indices of a batch of T candidate tasks, each with Q query sets (no images yet).

    Support and query positions are class-balanced and shuffled; ``*_labels`` give the class position
    in ``0 .. n_way - 1`` of each image.

    Attributes:
        classes: (T, n_way) dataset class ids of each task.
        support: (T, n_way * k_shot) image indices.
        support_labels: (T, n_way * k_shot).
        query: (T, Q, n_way * query_shots) image indices.
        query_labels: (T, Q, n_way * query_shots).
    """

    classes: np.ndarray
    support: np.ndarray
    support_labels: np.ndarray
    query: np.ndarray
    query_labels: np.ndarray


class SealedLabels:
    """Query labels that travel with a batch but are read only by ``LabelLedger.reveal``.

    The loader cannot know which query sets the sampler will choose, so every query set carries its
    labels; this wrapper keeps them out of reach of everything else (no tensor protocol, no indexing).
    It moves between devices with the batch.
    """

    __slots__ = ("_labels",)

    def __init__(self, labels: Tensor):
        self._labels = labels

    @property
    def shape(self) -> torch.Size:
        return self._labels.shape

    def to(self, *args, **kwargs) -> SealedLabels:
        """The labels on another device. From page-locked memory the copy is asynchronous, as Lightning makes it
        for the batch's tensors (it passes ``non_blocking`` to tensors only): a blocking copy here made the host wait
        for the GPU to drain its queue at every step, so Lightning's work could not overlap the GPU's."""
        if "non_blocking" not in kwargs and self._labels.is_pinned():
            kwargs["non_blocking"] = True  # host-to-device from pinned memory: ordered on the stream, safe
        return SealedLabels(self._labels.to(*args, **kwargs))

    def pin_memory(self) -> SealedLabels:
        return SealedLabels(self._labels.pin_memory())

    def __repr__(self) -> str:
        return f"SealedLabels(shape={tuple(self._labels.shape)})"


@dataclass
class TaskBatch:
    """A meta-batch of T tasks with Q candidate query sets each.

    Attributes:
        support_x: (T, n_way * k_shot, C, H, W) support images.
        support_y: (T, n_way * k_shot) support labels in ``0 .. n_way - 1`` (support sets are labeled).
        query_x: (T, Q, n_way * query_shots, C, H, W) unlabeled candidate query sets.
        query_y: sealed (T, Q, n_way * query_shots) query labels; only the ledger opens them.
        classes: (T, n_way) dataset class ids of each task (for analysis; not a label of any image).
        step: the step this batch was drawn for.
    """

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: SealedLabels
    classes: Tensor
    step: int = 0

    def pin_memory(self) -> TaskBatch:
        """The batch in page-locked memory (the loader's ``pin_memory``): it then moves to a GPU asynchronously."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "step"}
        pinned = {name: value.pin_memory() if _on_cpu(value) else value for name, value in values.items()}
        return TaskBatch(**pinned, step=self.step)  # images gathered on the GPU already stay there

    @property
    def num_tasks(self) -> int:
        return self.support_x.shape[0]

    @property
    def num_query_sets(self) -> int:
        return self.query_x.shape[1]


def _on_cpu(value: Tensor | SealedLabels) -> bool:
    return (value._labels if isinstance(value, SealedLabels) else value).device.type == "cpu"

"""Training episodes of an annotation project: each task's support set and the query sets labeled so far.

A training step draws ``num_candidates`` tasks among those with labeled query sets, ``k_shot`` support images per
class from each task's support set, and ``query_sets`` candidate query sets from its labeled ones (all of them
once each when it has enough, else every one plus repeats). Query labels are sealed as in any ``TaskBatch``: the
model's sampler chooses among the candidates and its ``LabelLedger`` reveals the chosen ones.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from units_lightning.annotation.holdout import HeldOutSet
from units_lightning.annotation.images import load_pixels
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.layout import AnnotationProject
from units_lightning.data.datasets.images import TensorImages
from units_lightning.data.episodic import build_batch
from units_lightning.episode import EpisodeIndices, EpisodeSpec, TaskBatch

__all__ = ["LabeledEpisodes", "LabeledTask", "check_tasks", "draw_labeled_episode", "labeled_tasks"]


@dataclass(frozen=True)
class LabeledTask:
    """A task's images as indices into the project's training images.

    Attributes:
        name: the task's name.
        classes: (n_way,) ids of its classes among the training images' classes.
        support: one array of image indices per class.
        query_sets: (S, M) image indices of its S labeled query sets.
        query_labels: (S, M) class positions of those images, in ``0 .. n_way - 1``.
    """

    name: str
    classes: np.ndarray
    support: tuple[np.ndarray, ...]
    query_sets: np.ndarray
    query_labels: np.ndarray


def check_tasks(project: AnnotationProject, spec: EpisodeSpec) -> None:
    """Refuse a project whose tasks do not fit the episode shape: ``n_way`` classes, ``k_shot`` support images each.

    Raises:
        ValueError: naming the task, the class and the numbers.
    """
    for task in project.tasks:
        if task.n_way != spec.n_way:
            raise ValueError(
                f"task {task.name!r} has {task.n_way} classes ({', '.join(task.classes)}) but data.n_way={spec.n_way}: "
                "every task of a project needs n_way class folders under support/"
            )
        for name, images in zip(task.classes, task.support, strict=True):
            if len(images) < spec.k_shot:
                raise ValueError(
                    f"class {name!r} of task {task.name!r} has {len(images)} support image(s) but data.k_shot="
                    f"{spec.k_shot}: add images to {project.root}/tasks/{task.name}/support/{name} or lower k_shot"
                )


def labeled_tasks(
    project: AnnotationProject,
    store: LabelStore,
    spec: EpisodeSpec,
    image_shape: tuple[int, int, int],
    held_out: Collection[tuple[str, ...]] = frozenset(),
) -> tuple[TensorImages, list[LabeledTask], list[HeldOutSet]]:
    """The images (support images and labeled query images, decoded once), every task with labeled query sets to
    train on, and the held-out query sets.

    Args:
        held_out: the query sets (by their images) that validate instead of training (``holdout.held_out_sets``):
            they are left out of the tasks' ``query_sets`` (a task whose every set is held out does not train).

    Raises:
        ValueError: the project does not fit ``spec`` (``check_tasks``); no query set is labeled yet; the store
            names an image or task the project no longer has, a class its task does not have, or a query set of
            another size than ``n_way * query_shots``; every labeled query set is held out.
    """
    check_tasks(project, spec)
    set_size = spec.n_way * spec.query_shots
    owner = project.unlabeled_owner()
    names: list[str] = []
    class_names: list[str] = []
    labels: list[int] = []
    tasks, validation = [], []
    for task in project.tasks:
        labeled = store.query_sets(task.name)
        if not labeled:
            continue
        first_class = len(class_names)
        class_names += [f"{task.name}/{c}" for c in task.classes]
        support = []
        for position, images in enumerate(task.support):
            support.append(np.arange(len(names), len(names) + len(images)))
            names += images
            labels += [first_class + position] * len(images)
        classes = np.arange(first_class, first_class + task.n_way)
        query_sets, query_labels = [], []
        for query_set in labeled:
            if len(query_set.images) != set_size:
                raise ValueError(
                    f"a labeled query set of task {task.name!r} has {len(query_set.images)} images but data.n_way x "
                    f"data.query_shots = {set_size}: train with the episode shape the batches were selected with"
                )
            positions = []
            for image in query_set.images:
                if owner.get(image) is not task:
                    raise ValueError(
                        f"the label store names image {image!r} of task {task.name!r}, which is not among the task's "
                        f"unlabeled images in {project.root}: put the file back, or remove its batch from the store"
                    )
                positions.append(task.label_of(image, store.labels[image]))
            indices = np.arange(len(names), len(names) + set_size)
            if query_set.images in held_out:
                validation.append(
                    HeldOutSet(task.name, classes, tuple(support), indices, np.asarray(positions, dtype=np.int64))
                )
            else:
                query_sets.append(indices)
                query_labels.append(positions)
            names += query_set.images
            labels += [first_class + p for p in positions]
        if query_sets:
            tasks.append(
                LabeledTask(
                    task.name,
                    classes,
                    tuple(support),
                    np.stack(query_sets),
                    np.asarray(query_labels, dtype=np.int64),
                )
            )
    if not tasks and not validation:
        raise ValueError(
            f"no query set of {project.root} is labeled yet: run `units-lightning select`, label the batch and "
            "`units-lightning ingest` it first (docs/ANNOTATION.md)"
        )
    if not tasks:
        raise ValueError(
            f"all {len(validation)} labeled query set(s) of {project.root} are held out for validation "
            "(data.val_share): label more query sets, or lower data.val_share"
        )
    images = TensorImages(load_pixels(project, names, image_shape), torch.tensor(labels), class_names, split="train")
    return images, tasks, validation


def draw_labeled_episode(
    tasks: list[LabeledTask], rng: np.random.Generator, num_tasks: int, query_sets: int, k_shot: int
) -> EpisodeIndices:
    """The candidate tasks of one training step.

    Args:
        tasks: the tasks with labeled query sets.
        rng: the step's generator.
        num_tasks: tasks to draw (the sampler's ``num_candidates``); drawn without replacement when there are
            that many, else with.
        query_sets: candidate query sets per task (the sampler's ``query_sets``).
        k_shot: support images per class.

    Returns:
        EpisodeIndices of ``num_tasks`` tasks with ``query_sets`` labeled query sets each.
    """
    picked = rng.choice(len(tasks), size=num_tasks, replace=len(tasks) < num_tasks)
    n_way = len(tasks[0].classes)
    support_labels = np.repeat(np.arange(n_way), k_shot)
    classes, support, shuffled_labels, query, query_labels = [], [], [], [], []
    for t in picked:
        task = tasks[t]
        order = rng.permutation(support_labels.size)
        images = np.concatenate([rng.choice(pool, size=k_shot, replace=False) for pool in task.support])
        available = len(task.query_sets)
        sets = rng.permutation(available)[:query_sets]
        if available < query_sets:
            sets = np.concatenate([sets, rng.choice(available, size=query_sets - available)])
        classes.append(task.classes)
        support.append(images[order])
        shuffled_labels.append(support_labels[order])
        query.append(task.query_sets[sets])
        query_labels.append(task.query_labels[sets])
    return EpisodeIndices(
        np.stack(classes), np.stack(support), np.stack(shuffled_labels), np.stack(query), np.stack(query_labels)
    )


class LabeledEpisodes(Dataset):
    """Item ``i`` is the meta-batch of step ``i``, drawn from a generator seeded by (seed, 0, rank, i), as
    ``EpisodeDataset`` draws training steps: reproducible, resumable and different on each rank."""

    def __init__(
        self,
        images: TensorImages,
        tasks: list[LabeledTask],
        num_tasks: int,
        query_sets: int,
        k_shot: int,
        seed: int,
        rank: int = 0,
    ):
        self.images, self.tasks = images, tasks
        self.num_tasks, self.query_sets, self.k_shot = num_tasks, query_sets, k_shot
        self.seed, self.rank = seed, rank

    def __getitem__(self, step: int) -> TaskBatch:
        rng = np.random.default_rng([self.seed, 0, self.rank, step])
        indices = draw_labeled_episode(self.tasks, rng, self.num_tasks, self.query_sets, self.k_shot)
        return build_batch(self.images, indices, step=step)

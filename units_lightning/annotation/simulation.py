"""Annotation projects made from labeled data, for experiments and tests: the labels become a held-out answer key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from units_lightning.annotation.layout import SUPPORT_FOLDER, TASKS_FOLDER, UNLABELED_FOLDER
from units_lightning.data.datasets.images import FewShotImages

__all__ = ["write_simulated_project"]


def _save_png(pixels: torch.Tensor, path: Path) -> None:
    """Save (C, H, W) floats in [0, 1] as an 8-bit grey or RGB PNG (exact for images that came from uint8)."""
    array = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array[0] if array.shape[0] == 1 else array.transpose(1, 2, 0)).save(path)


def write_simulated_project(
    images: FewShotImages,
    root: str | Path,
    tasks: int,
    n_way: int,
    k_shot: int,
    unlabeled_per_class: int,
    seed: int = 0,
) -> dict[str, str]:
    """Write a project of ``tasks`` tasks drawn from ``images`` and return the answer key of its unlabeled images.

    Each task takes ``n_way`` classes that no other task uses, ``k_shot`` support images of each (as
    ``tasks/task-<t>/support/<class>/<i>.png``) and ``unlabeled_per_class`` other images of each, shuffled together
    and named by number only (``tasks/task-<t>/unlabeled/<i>.png``), so that nothing but the key tells their class.
    The pixels are ``images.gather``'s (unnormalised data round-trips exactly through the 8-bit PNGs).

    Args:
        images: a labeled collection without normalisation (values in [0, 1]).
        root: the project folder to write (its ``tasks`` folder must not exist yet).
        tasks, n_way, k_shot, unlabeled_per_class: the project's shape.
        seed: seed of the draw.

    Returns:
        The answer key, ``{image name: class name}`` for every unlabeled image.

    Raises:
        ValueError: too few classes or images per class for that shape, or ``root`` already holds tasks.
    """
    root = Path(root)
    if (root / TASKS_FOLDER).exists():
        raise ValueError(f"{root / TASKS_FOLDER} exists already: write a simulated project into a new folder")
    labels = images.labels.numpy()
    per_class = k_shot + unlabeled_per_class
    usable = [c for c in range(images.num_classes) if np.count_nonzero(labels == c) >= per_class]
    if len(usable) < tasks * n_way:
        raise ValueError(
            f"{tasks} tasks of {n_way} classes need {tasks * n_way} classes with {per_class} images each; "
            f"the collection has {len(usable)}"
        )
    rng = np.random.default_rng(seed)
    classes = rng.choice(usable, size=(tasks, n_way), replace=False)
    answer_key = {}
    for t, task_classes in enumerate(classes):
        folder = root / TASKS_FOLDER / f"task-{t:03d}"
        unlabeled = []
        for c in task_classes:
            name = f"class-{int(c):04d}"
            picks = rng.choice(np.flatnonzero(labels == c), size=per_class, replace=False)
            pixels = images.gather(torch.from_numpy(picks))
            for i in range(k_shot):
                _save_png(pixels[i], folder / SUPPORT_FOLDER / name / f"{i}.png")
            unlabeled += [(pixels[i], name) for i in range(k_shot, per_class)]
        for i, n in enumerate(rng.permutation(len(unlabeled))):
            pixel, name = unlabeled[n]
            path = folder / UNLABELED_FOLDER / f"{i:04d}.png"
            _save_png(pixel, path)
            answer_key[path.relative_to(root).as_posix()] = name
    return answer_key

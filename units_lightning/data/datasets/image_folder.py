"""A user's own images: a folder (or zip) of class folders, split into train / val / test by class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from units_lightning.data.datasets.class_images import ClassImages, Decoding, ImageSource, load_class_images
from units_lightning.data.datasets.split_layout import SPLIT_NAMES

DEFAULT_SPLIT_RATIOS = (0.64, 0.16, 0.2)  # CIFAR-FS's and mini-ImageNet's 64 / 16 / 20 classes of 100


def load_image_folder(root: str | Path, image_shape: Sequence[int], cache_dir: str | Path | None = None) -> ClassImages:
    """All images of ``root/<class>/<image>`` (or of a zip of that layout), decoded once and cached.

    Args:
        root: a folder of class folders, or a zip whose entries are ``<class>/<image>``.
        image_shape: (channels, height, width); images are converted (grey / RGB) and resized to it.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / "image_folder"``.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: see ``load_class_images``.
    """
    root = Path(root).expanduser()
    fix = "point root at a folder of class folders (<class>/<image>), or a zip of one"
    return load_class_images([ImageSource(root)], Decoding(tuple(image_shape), cache_dir, "image_folder", fix=fix))


def split_by_ratios(num_classes: int, ratios: Sequence[float], seed: int = 0) -> dict[str, list[int]]:
    """Assign classes to train / val / test at random, in the given proportions.

    Split sizes are ``round(ratio * num_classes)`` for val and test (at least 1 each when their ratio is
    positive) and the rest for train, so that they always add up.

    Args:
        num_classes: how many classes there are.
        ratios: three non-negative numbers (train, val, test) summing to 1 (within 1e-6).
        seed: seed of the class permutation; the same seed gives the same split.

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}`` class ids, each list sorted.

    Raises:
        ValueError: bad ratios, or too few classes for a split of at least one class each.

    Example:
        >>> {name: len(ids) for name, ids in split_by_ratios(100, (0.64, 0.16, 0.2)).items()}
        {'train': 64, 'val': 16, 'test': 20}
    """
    ratios = [float(r) for r in ratios]
    if len(ratios) != 3 or min(ratios) < 0 or abs(sum(ratios) - 1.0) > 1e-6:
        raise ValueError(
            f"split ratios must be three non-negative numbers (train, val, test) summing to 1, got {ratios}"
        )
    sizes = [0] + [max(1, round(r * num_classes)) if r > 0 else 0 for r in ratios[1:]]
    sizes[0] = num_classes - sizes[1] - sizes[2]
    if sizes[0] < 1:
        raise ValueError(f"{num_classes} classes are too few for split ratios {ratios} (sizes would be {sizes})")
    order = np.random.default_rng(seed).permutation(num_classes)
    bounds = np.cumsum(sizes)[:-1]
    return {name: sorted(int(c) for c in part) for name, part in zip(SPLIT_NAMES, np.split(order, bounds), strict=True)}


def split_by_lists(class_names: Sequence[str], lists: Mapping[str, Sequence[str]]) -> dict[str, list[int]]:
    """Class ids of each split from lists of class names.

    Args:
        class_names: all classes of the folder.
        lists: ``{"train": [...], "val": [...], "test": [...]}`` class folder names; a split may be left
            out (it is then unavailable), no class may be in two splits.

    Raises:
        ValueError: an unknown split, an unknown class (named, with the known ones), or a class in two splits.
    """
    unknown_splits = sorted(set(lists) - set(SPLIT_NAMES))
    if unknown_splits:
        raise ValueError(f"split lists must be keyed by {list(SPLIT_NAMES)}, got unknown {unknown_splits}")
    ids = {name: i for i, name in enumerate(class_names)}
    result: dict[str, list[int]] = {}
    seen: dict[str, str] = {}
    for split, names in lists.items():
        missing = [n for n in names if n not in ids]
        if missing:
            raise ValueError(
                f"split '{split}' lists classes {missing} that are not in the folder; it has {list(class_names)}"
            )
        for name in names:
            if name in seen:
                raise ValueError(f"class {name!r} is in both split '{seen[name]}' and split '{split}'")
            seen[name] = split
        result[split] = [ids[n] for n in names]
    return result

"""The split-folder layout ``root/{train,val,test}/<class>/<image>``, as folders or as zips of that layout.

``root`` may hold the split folders, or zips whose entries are ``<split>/<class>/<image>`` (or
``<class>/<image>``) and whose names start with the split's name: ``train.zip``, or several parts such as
``train-a.zip`` and ``train-b.zip``, whose classes are merged. Zips are read in place, never extracted,
after every entry has been checked (no absolute paths, no ``..`` escapes, no symlinks, no zip bombs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from units_lightning.data.datasets.class_images import ClassImages, Decoding, ImageSource, load_class_images

SPLIT_NAMES = ("train", "val", "test")
# Folder and zip names that count as each split (learn2learn and others say "validation").
SPLIT_ALIASES = {"train": ("train",), "val": ("val", "validation"), "test": ("test",)}


def _zip_is_for(zip_name: str, aliases: Sequence[str]) -> bool:
    stem = zip_name[: -len(".zip")].lower()
    return any(stem == alias or (stem.startswith(alias) and not stem[len(alias)].isalnum()) for alias in aliases)


def find_split_sources(root: Path, split: str) -> list[ImageSource]:
    """The folder, or the zips, that hold ``split`` under ``root``; empty if none.

    A folder ``root/<split>`` wins over zips. Zips count when their name is the split's name or starts
    with it followed by a non-alphanumeric character (``train-a.zip``, ``train_subset.zip``).

    Args:
        root: the dataset root.
        split: "train", "val" or "test".
    """
    aliases = SPLIT_ALIASES.get(split, (split,))
    for alias in aliases:
        if (root / alias).is_dir():
            return [ImageSource(root / alias)]
    if not root.is_dir():
        return []
    zips = sorted(p for p in root.iterdir() if p.suffix.lower() == ".zip" and p.is_file())
    prefixes = (*((alias,) for alias in aliases), ())
    return [ImageSource(path, prefixes) for path in zips if _zip_is_for(path.name, aliases)]


def split_locations(root: Path, split: str) -> list[str]:
    """Where ``find_split_sources`` looks for ``split``, for error messages."""
    aliases = SPLIT_ALIASES.get(split, (split,))
    return [f"{root / alias}/" for alias in aliases] + [f"{root / alias}*.zip" for alias in aliases]


def has_split_layout(root: Path, splits: Sequence[str] = SPLIT_NAMES) -> bool:
    """Whether every one of ``splits`` has a folder or zips under ``root``."""
    return all(find_split_sources(root, split) for split in splits)


def load_split_layout(root: str | Path, split: str, decoding: Decoding) -> ClassImages:
    """One split of a split-folder dataset, decoded once and cached (see ``load_class_images``).

    Args:
        root: folder holding ``<split>/<class>/<image>`` or zips of that layout.
        split: "train", "val" or "test".
        decoding: the output shape, the cache folder, the dataset's name and what to tell the user when the
            split is missing or a file is corrupt.

    Raises:
        FileNotFoundError: no folder or zip of ``split`` under ``root``; the message lists where it looked.
        ValueError: see ``load_class_images``.
    """
    root = Path(root).expanduser()
    sources = find_split_sources(root, split)
    if not sources:
        raise FileNotFoundError(
            f"{decoding.name}: split '{split}' not found under {root} "
            f"(looked for {', '.join(split_locations(root, split))}); {decoding.fix}"
        )
    return load_class_images(sources, decoding)

"""Tiny fake image datasets for the data tests, and the ../shared/data lookup (importable: tests/ is on the path)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_setup import SHARED_DATA


def shared(subfolder: str) -> Path:
    """``../shared/data/<subfolder>``, or skip the test with the reason."""
    path = SHARED_DATA / subfolder
    if not path.is_dir():
        pytest.skip(f"../shared/data not found: {path} is absent (set UNITS_LIGHTNING_SHARED_DATA to the shared data)")
    return path


def pixel_of(class_index: int, image_index: int) -> tuple[int, int, int]:
    """A colour unique to (class, image), so tests can tell which file an output pixel came from."""
    return (10 + 20 * class_index, 5 + 7 * image_index, 200)


def write_image(path: Path, class_index: int, image_index: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), pixel_of(class_index, image_index)).save(path)


def write_split_layout(root: Path, classes: dict[str, list[str]], images_per_class: int = 4) -> Path:
    """``root/<split>/<class>/<n>.png`` with a colour per (class, image); class index counts over all splits."""
    index = 0
    for split, names in classes.items():
        for name in names:
            for n in range(images_per_class):
                write_image(root / split / name / f"{n}.png", index, n)
            index += 1
    return root


def zip_tree(folder: Path, zip_path: Path, under: Path, only: list[str] | None = None) -> Path:
    """Zip the files under ``folder`` with entry names relative to ``under`` (``only``: top-level names)."""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(under)
            if path.is_file() and (only is None or relative.parts[1] in only):
                archive.write(path, relative.as_posix())
    return zip_path


def image_array(class_index: int, image_index: int) -> np.ndarray:
    return np.array(pixel_of(class_index, image_index), dtype=np.uint8)

"""Class-folder image collections (``<class>/<image>``, in folders or zips), decoded once into a cached tensor.

``load_class_images`` is the reader behind CIFAR-FS, mini-ImageNet, users' own folders and the
out-of-distribution sets: it lists the images of one or more sources (zips are read in place, every entry
vetted as ``safe_extract`` vets it), decodes them to a fixed shape, and saves the uint8 result under a key of
the sources' sizes and modification times, so that every later load reads one file and decodes nothing.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from units_lightning.data.datasets.images import TensorImages
from units_lightning.data.io.archive import default_cache_dir, open_zip
from units_lightning.data.io.decode import DEFAULT_RESAMPLE, decode_image
from units_lightning.data.io.files import (
    ImageFile,
    fingerprint,
    list_folder_images,
    list_zip_images,
    read_image_bytes,
)
from units_lightning.data.io.tensor_cache import cache_key, read_cache, write_cache

__all__ = ["ClassImages", "Decoding", "ImageSource", "load_class_images", "load_labelled_images"]

_CACHE_FORMAT = 1
_DECODE_CHUNK = 512


@dataclass(frozen=True)
class ImageSource:
    """A folder of class folders, or a zip whose entries are ``<prefix>/<class>/<image>``.

    Attributes:
        path: the folder (``path/<class>/<image>``) or the zip.
        prefixes: for a zip, the leading folders its entries may have, tried in order (``()`` for none);
            entries under other top folders are ignored. Unused for a folder.
    """

    path: Path
    prefixes: tuple[tuple[str, ...], ...] = field(default=((),))


@dataclass(frozen=True)
class Decoding:
    """How a collection's images are decoded and where the result is cached: all a loader is told besides
    where the images are.

    Attributes:
        image_shape: (channels, height, width) of the output; channels 1 or 3.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / name``.
        name: the dataset's name, for the cache file and messages.
        resample: PIL filter for resizing.
        fix: what to tell the user when a file is missing or corrupt.

    Raises:
        ValueError: ``image_shape`` is not (1 or 3, height, width) with positive sides.
    """

    image_shape: tuple[int, int, int]
    cache_dir: str | Path | None = None
    name: str = "images"
    resample: Image.Resampling = DEFAULT_RESAMPLE
    fix: str = "re-download the dataset"

    def __post_init__(self) -> None:
        shape = tuple(int(n) for n in self.image_shape)
        if len(shape) != 3 or shape[0] not in (1, 3) or min(shape[1:]) < 1:
            raise ValueError(f"image_shape must be (1 or 3, height, width), got {shape}")
        object.__setattr__(self, "image_shape", shape)

    def cache_path(self, key: str) -> Path:
        """The cache file of the collection whose cache key is ``key``."""
        root = Path(self.cache_dir).expanduser() if self.cache_dir is not None else default_cache_dir() / self.name
        shape_tag = "x".join(str(n) for n in self.image_shape)
        return root / f"{self.name}-{shape_tag}-{key[:16]}.pt"


@dataclass(frozen=True)
class ClassImages:
    """Decoded images of a class-folder collection.

    Attributes:
        images: (n, C, H, W) uint8, classes in sorted order, images sorted by file name within a class.
        labels: (n,) int64 class ids, contiguous from 0, non-decreasing.
        class_names: the class folder names, sorted.
    """

    images: Tensor
    labels: Tensor
    class_names: list[str]

    def as_split(
        self,
        split: str,
        class_ids: Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> TensorImages:
        """The images of some classes as a ``TensorImages`` split.

        Args:
            split: the split's name.
            class_ids: which classes, in the order of their new ids (default: all, as they are; no copy).
            mean, std: per-channel normalisation applied by ``gather`` (see ``TensorImages``).

        Raises:
            ValueError: a class id is out of range or repeated.
        """
        if class_ids is None:
            return TensorImages(self.images, self.labels, self.class_names, split, mean, std)
        class_ids = [int(c) for c in class_ids]
        if len(set(class_ids)) != len(class_ids) or any(not 0 <= c < len(self.class_names) for c in class_ids):
            raise ValueError(f"class ids must be distinct and in [0, {len(self.class_names)}), got {class_ids}")
        new_id = torch.full((len(self.class_names),), -1, dtype=torch.long)
        new_id[torch.tensor(class_ids, dtype=torch.long)] = torch.arange(len(class_ids))
        relabelled = new_id[self.labels]
        keep = relabelled >= 0
        names = [self.class_names[c] for c in class_ids]
        return TensorImages(self.images[keep], relabelled[keep], names, split, mean, std)


def list_source(source: ImageSource, archive: zipfile.ZipFile | None) -> list[tuple[str, ImageFile]]:
    """``(class name, image file)`` of every image in ``source`` (``archive`` is the open zip, if it is one).

    Raises:
        ValueError: an archive entry is unsafe, or an image lies at another depth than ``<class>/<image>``.
    """
    if archive is None:
        files = list_folder_images(source.path)
        classified = []
        for file in files:
            if len(file.parts) != 2:
                raise ValueError(
                    f"{file.location} is not in the layout <class>/<image> under {source.path}; "
                    "move it into a class folder or out of the dataset"
                )
            classified.append((file.parts[0], file))
        return classified
    classified = []
    for file in list_zip_images(archive, source.path):
        matching = [p for p in source.prefixes if file.parts[: len(p)] == p and len(file.parts) == len(p) + 2]
        if matching:
            classified.append((file.parts[-2], file))
        elif not source.prefixes or any(file.parts[: len(p)] == p for p in source.prefixes if p):
            layouts = " or ".join("/".join((*p, "<class>", "<image>")) for p in source.prefixes)
            raise ValueError(f"{file.location} does not follow the layout {layouts} of {source.path}")
    return classified


def decode_files(files: Sequence[ImageFile], decoding: Decoding) -> np.ndarray:
    """Decode ``files`` into one (n, C, H, W) uint8 array, in parallel threads (PIL releases the GIL).

    Bytes are read in the calling thread, chunk by chunk, so archives are never read concurrently.

    Raises:
        ValueError: a file cannot be read or decoded; the message names it.
    """
    shape, resample, fix = decoding.image_shape, decoding.resample, decoding.fix
    pixels = np.empty((len(files), *shape), dtype=np.uint8)
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(files), _DECODE_CHUNK):
            chunk = files[start : start + _DECODE_CHUNK]
            data = [read_image_bytes(file, fix) for file in chunk]
            decoded = pool.map(
                lambda item: decode_image(item[0], item[1].location, shape, resample, fix),
                zip(data, chunk, strict=True),
            )
            for offset, array in enumerate(decoded):
                pixels[start + offset] = array
    return pixels


def load_class_images(sources: Sequence[ImageSource], decoding: Decoding) -> ClassImages:
    """Read, decode and cache the images of one or more class-folder sources as one collection.

    A class may be spread over several sources (CIFAR-FS's train split comes in two zips); its images are
    merged. The result is saved in the cache under a key of the decoding (shape, filter) and the sources'
    sizes and modification times: a later call with unchanged sources reads it back without opening an image.

    Args:
        sources: the folders and zips.
        decoding: the output shape, the cache folder, the dataset's name and what to tell the user.

    Returns:
        The decoded collection.

    Raises:
        FileNotFoundError: a source does not exist.
        ValueError: no images at all, an image at another depth than ``<class>/<image>``, an unsafe archive
            entry, or a corrupt image (named by its file, ``<zip>/<member>`` inside an archive).
    """
    for source in sources:
        if not source.path.exists():
            raise FileNotFoundError(f"{decoding.name}: {source.path} does not exist; {decoding.fix}")

    def entries(stack: contextlib.ExitStack) -> list[tuple[str, ImageFile]]:
        found: list[tuple[str, ImageFile]] = []
        for source in sources:
            archive = stack.enter_context(open_zip(source.path)) if source.path.is_file() else None
            found.extend(list_source(source, archive))
        if not found:
            where = ", ".join(str(s.path) for s in sources)
            raise ValueError(f"{decoding.name}: no images in the layout <class>/<image> in {where}; {decoding.fix}")
        return found

    identity = [{**fingerprint(s.path), "prefixes": [list(p) for p in s.prefixes]} for s in sources]
    return load_labelled_images(entries, identity, decoding)


def load_labelled_images(
    list_entries: Callable[[contextlib.ExitStack], list[tuple[str, ImageFile]]], identity: object, decoding: Decoding
) -> ClassImages:
    """Decode and cache a collection given as ``(class name, image file)`` pairs.

    The general form of ``load_class_images``, for layouts where a list, not the folders, says which image
    belongs to which class (mini-ImageNet's CSVs).

    Args:
        list_entries: returns the pairs; may open archives on the given exit stack, which stays open
            while the images are read. Called only when the cache misses.
        identity: JSON-able description of the sources' content (sizes, mtimes); part of the cache key.
        decoding: as for ``load_class_images``.

    Returns:
        The decoded collection: classes sorted by name, images by file name (then listing order).

    Raises:
        ValueError: as ``list_entries`` raises, or a corrupt image (named by its file).
    """
    name = decoding.name
    description = {
        "format": _CACHE_FORMAT,
        "name": name,
        "image_shape": decoding.image_shape,
        "resample": int(decoding.resample),
        "sources": identity,
    }
    key = cache_key(description)
    cache_path = decoding.cache_path(key)
    cached = read_cache(cache_path, key, name)
    if cached is not None:
        return ClassImages(cached["images"], cached["labels"], list(cached["class_names"]))

    with contextlib.ExitStack() as stack:
        listed = list_entries(stack)
        order = sorted(range(len(listed)), key=lambda i: (listed[i][0], listed[i][1].parts[-1], i))
        entries = [listed[i] for i in order]
        class_names = sorted({cls for cls, _ in entries})
        class_ids = {cls: i for i, cls in enumerate(class_names)}
        pixels = decode_files([file for _, file in entries], decoding)
    collection = ClassImages(
        torch.from_numpy(pixels), torch.tensor([class_ids[cls] for cls, _ in entries], dtype=torch.long), class_names
    )
    payload = {"images": collection.images, "labels": collection.labels, "class_names": class_names}
    write_cache(cache_path, key, payload, name)
    return collection

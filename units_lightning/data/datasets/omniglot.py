"""Omniglot (Lake et al., Science 2015): 1,623 handwritten characters of 50 alphabets, 20 drawings each.

``load_omniglot`` reads the official release from a folder or its zips (or torchvision's download) and
decodes it once into a uint8 tensor cached on disk; ``omniglot_splits`` cuts the characters into the
few-shot train/val/test splits, with rotation-augmented classes where asked.

Character order, on which the splits rely: the 30 background alphabets sorted by name, each alphabet's
characters sorted by name, then the 20 evaluation alphabets likewise (964 + 659 = 1,623 characters).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from units_lightning.data.datasets.images import FewShotImages, RotatedClasses, TensorImages
from units_lightning.data.io.archive import default_cache_dir, open_zip
from units_lightning.data.io.decode import decode_image
from units_lightning.data.io.files import (
    ImageFile,
    fingerprint,
    list_folder_images,
    list_zip_images,
    read_image_bytes,
)
from units_lightning.data.io.tensor_cache import cache_key as hash_description
from units_lightning.data.io.tensor_cache import read_cache, write_cache

OMNIGLOT_SETS = ("images_background", "images_evaluation")
TORCHVISION_FOLDER = "omniglot-py"
SPLIT_NAMES = ("train", "val", "test")
# The paper's code meta-trains on 1,200 characters, 1,150 for training and 50 for validation, and tests on
# the remaining 423 (the protocol of Vinyals et al. 2016 and MAML, with a validation split carved out).
DEFAULT_SPLIT_SIZES = (1150, 50, 423)
_CACHE_FORMAT = 2
_FIX = "re-download Omniglot"
_DOWNLOAD_HELP = (
    "download the official images_background.zip and images_evaluation.zip from "
    "https://github.com/brendenlake/omniglot (folder python/) into that folder"
)


@dataclass(frozen=True)
class OmniglotFile:
    """One drawing: where it lives and whose it is.

    Attributes:
        alphabet: alphabet folder name.
        character: character folder name, e.g. "character07".
        name: file name, e.g. "0115_03.png".
        location: readable location for messages ("<folder or zip>/<path inside>").
        read: returns the file's bytes.
    """

    alphabet: str
    character: str
    name: str
    location: str
    read: Callable[[], bytes]


def find_omniglot_set(root: Path, set_name: str) -> Path | None:
    """Where one half of Omniglot lives under ``root``, if anywhere.

    Looks, in order, for the folders ``root/<set>`` and ``root/omniglot-py/<set>`` (torchvision), then the
    zips ``root/<set>.zip`` and ``root/omniglot-py/<set>.zip``.

    Args:
        root: the dataset root.
        set_name: "images_background" or "images_evaluation".

    Returns:
        The folder or zip, or None.
    """
    for base in (root, root / TORCHVISION_FOLDER):
        if (base / set_name).is_dir():
            return base / set_name
    for base in (root, root / TORCHVISION_FOLDER):
        if (base / f"{set_name}.zip").is_file():
            return base / f"{set_name}.zip"
    return None


def download_omniglot(root: Path, set_names: Sequence[str]) -> None:
    """Download sets of Omniglot with torchvision into ``root/omniglot-py``.

    Raises:
        Exception: whatever torchvision raises (typically a network error when offline), with a note on
            how to get the files by hand.
    """
    from torchvision.datasets import Omniglot as TorchvisionOmniglot

    for set_name in set_names:
        try:
            TorchvisionOmniglot(str(root), background=set_name == "images_background", download=True)
        except Exception as error:
            note = (
                f"units_lightning: downloading Omniglot's {set_name} with torchvision into "
                f"{root / TORCHVISION_FOLDER} failed. If this machine is offline, {_DOWNLOAD_HELP} and pass "
                "that folder as root."
            )
            if hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(note)
            raise


def resolve_omniglot_sources(root: Path, download: bool) -> list[Path]:
    """The folder or zip of each half of Omniglot, downloading missing halves if asked.

    Raises:
        FileNotFoundError: a half is missing and ``download`` is False, or still missing after download.
    """
    sources = {name: find_omniglot_set(root, name) for name in OMNIGLOT_SETS}
    missing = [name for name, source in sources.items() if source is None]
    if missing and download:
        download_omniglot(root, missing)
        sources = {name: find_omniglot_set(root, name) for name in OMNIGLOT_SETS}
        missing = [name for name, source in sources.items() if source is None]
    if missing:
        looked_for = ", ".join(
            f"{base / name}{suffix}"
            for name in missing
            for suffix in ("/", ".zip")
            for base in (root, root / TORCHVISION_FOLDER)
        )
        raise FileNotFoundError(
            f"Omniglot not found under {root}: missing {' and '.join(missing)} (looked for {looked_for}). "
            "Pass download=True (on the command line: --data.download true) to fetch it with torchvision, "
            "or point root at a folder that holds "
            "images_background/ and images_evaluation/ (or images_background.zip and "
            f"images_evaluation.zip); to do it by hand, {_DOWNLOAD_HELP}."
        )
    return [sources[name] for name in OMNIGLOT_SETS]  # type: ignore[misc]


def list_folder(folder: Path) -> list[OmniglotFile]:
    """Drawings in ``folder/<alphabet>/<character>/<image>.png``, sorted at every level.

    Hidden entries, non-PNG files and PNGs at other depths are ignored.
    """
    return [_drawing(file) for file in list_folder_images(folder, (".png",)) if len(file.parts) == 3]


def list_zip(archive: zipfile.ZipFile, zip_path: Path, set_name: str) -> list[OmniglotFile]:
    """Drawings in a zip of ``<set>/<alphabet>/<character>/<image>.png`` (the top folder may be absent).

    Raises:
        ValueError: an entry is unsafe (absolute, escaping via ``..``, a symlink, a zip bomb), or a PNG
            lies at another depth than the layout says.
    """
    files = []
    for file in list_zip_images(archive, zip_path, (".png",)):
        parts = file.parts[1:] if len(file.parts) == 4 and file.parts[0] == set_name else file.parts
        if len(parts) != 3:
            raise ValueError(
                f"{file.location} does not follow the Omniglot layout "
                f"{set_name}/<alphabet>/<character>/<image>.png; use the official archive"
            )
        files.append(_drawing(ImageFile(parts, file.location, file.read)))
    return sorted(files, key=lambda f: (f.alphabet, f.character, f.name))


def _drawing(file: ImageFile) -> OmniglotFile:
    alphabet, character, name = file.parts
    return OmniglotFile(alphabet, character, name, file.location, file.read)


def group_by_character(files: Sequence[OmniglotFile], source: Path) -> tuple[list[str], list[list[OmniglotFile]]]:
    """Group sorted drawings by character and check that every character has as many drawings.

    Args:
        files: drawings sorted by (alphabet, character, name).
        source: the folder or zip, for messages.

    Returns:
        ``"alphabet/character"`` names and the drawings of each character, in order.

    Raises:
        ValueError: no drawings at all, or characters with different numbers of drawings.
    """
    names: list[str] = []
    groups: list[list[OmniglotFile]] = []
    for file in files:
        name = f"{file.alphabet}/{file.character}"
        if not names or names[-1] != name:
            names.append(name)
            groups.append([])
        groups[-1].append(file)
    if not groups:
        raise ValueError(
            f"{source} holds no PNG images in the layout <alphabet>/<character>/<image>.png; "
            "it is empty or not Omniglot. Delete it and download again."
        )
    expected = len(groups[0])
    for name, group in zip(names, groups, strict=True):
        if len(group) != expected:
            raise ValueError(
                f"{source}: character {name} has {len(group)} drawings but {names[0]} has {expected}; "
                "every character must have as many (Omniglot has 20). The copy is incomplete: re-download it."
            )
    return names, groups


def decode_drawing(data: bytes, image_size: int, location: str) -> np.ndarray:
    """One Omniglot PNG as an (image_size, image_size) uint8 array, strokes bright (255) on black (0).

    The official drawings are black strokes on white; they are resized with Lanczos filtering and inverted.

    Raises:
        ValueError: the bytes are not a decodable image; the message names ``location``.
    """
    grey = decode_image(data, location, (1, image_size, image_size), Image.Resampling.LANCZOS, _FIX)
    return 255 - grey[0]


def decode_characters(groups: Sequence[Sequence[OmniglotFile]], image_size: int) -> Tensor:
    """Decode drawings grouped by character into (n_characters, n_drawings, 1, S, S) uint8.

    Raises:
        ValueError: a file cannot be read from its archive or decoded; the message names it.
    """
    per_character = len(groups[0])
    images = np.empty((len(groups), per_character, 1, image_size, image_size), dtype=np.uint8)
    for c, group in enumerate(groups):
        for i, file in enumerate(group):
            data = read_image_bytes(ImageFile((), file.location, file.read), _FIX)
            images[c, i, 0] = decode_drawing(data, image_size, file.location)
    return torch.from_numpy(images)


def cache_key(sources: Sequence[Path], image_size: int) -> str:
    """Hex digest naming a decoded cache: format, image size and the sources' fingerprints."""
    return hash_description(
        {
            "format": _CACHE_FORMAT,
            "image_size": image_size,
            "sources": [fingerprint(source, (".png",)) for source in sources],
        }
    )


def load_omniglot(
    root: str | Path,
    download: bool = False,
    cache_dir: str | Path | None = None,
    image_size: int = 28,
) -> tuple[Tensor, list[str]]:
    """All Omniglot characters as one uint8 tensor, decoded once and cached.

    ``root`` may hold the official layout ``images_background/<alphabet>/<character>/<image>.png`` and
    ``images_evaluation/...``, the zips ``images_background.zip`` and ``images_evaluation.zip`` (read in
    place, never extracted; every entry is checked as ``safe_extract`` would), or torchvision's download
    ``omniglot-py/...``. The decoded tensor is saved in ``cache_dir`` under a name keyed by ``image_size``
    and the sizes and modification times of the source files, so a later load reads one file.

    Args:
        root: folder holding Omniglot in one of the layouts above.
        download: fetch missing halves with ``torchvision.datasets.Omniglot`` into ``root/omniglot-py``.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / "omniglot"``.
        image_size: side of the square output images (the originals are 105 x 105).

    Returns:
        images: (n_characters, n_drawings, 1, image_size, image_size) uint8, strokes 255 on background 0
            ((1623, 20, 1, 28, 28) for the full release), characters in the order described in the module
            docstring, drawings sorted by file name.
        names: ``"alphabet/character"`` of each character.

    Raises:
        FileNotFoundError: neither layout is under ``root`` and ``download`` is False.
        ValueError: an image is corrupt (the message names it), an archive entry is unsafe, or the layout
            is incomplete (characters with different numbers of drawings).
    """
    if image_size < 1:
        raise ValueError(f"image_size must be a positive number of pixels, got {image_size}")
    root = Path(root).expanduser()
    sources = resolve_omniglot_sources(root, download)
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir() / "omniglot"
    key = cache_key(sources, image_size)
    cache_path = cache_root / f"omniglot-{image_size}px-{key[:16]}.pt"
    cached = read_cache(cache_path, key, "Omniglot")
    if cached is not None:
        return cached["images"], list(cached["names"])

    names: list[str] = []
    parts: list[Tensor] = []
    for source, set_name in zip(sources, OMNIGLOT_SETS, strict=True):
        if source.is_file():
            with open_zip(source) as archive:
                set_names, groups = group_by_character(list_zip(archive, source, set_name), source)
                parts.append(decode_characters(groups, image_size))
        else:
            set_names, groups = group_by_character(list_folder(source), source)
            parts.append(decode_characters(groups, image_size))
        names.extend(set_names)
    if parts[0].shape[1] != parts[1].shape[1]:
        raise ValueError(
            f"{sources[0]} has {parts[0].shape[1]} drawings per character but {sources[1]} has "
            f"{parts[1].shape[1]}; the copy is incomplete: re-download it"
        )
    images = torch.cat(parts)
    write_cache(cache_path, key, {"images": images, "names": names}, "Omniglot")
    return images, names


def omniglot_splits(
    images: Tensor,
    names: Sequence[str],
    split_sizes: Sequence[int] = DEFAULT_SPLIT_SIZES,
    rotations: Sequence[int] = (0, 90, 180, 270),
    rotate_splits: Sequence[str] = ("train",),
) -> dict[str, FewShotImages]:
    """Cut Omniglot characters into consecutive train / val / test splits.

    With the defaults: characters 0-1149 train, 1150-1199 val, 1200-1622 test, train classes multiplied
    by four with rotations (4,600 classes).

    Args:
        images: (n_characters, n_drawings, 1, H, W) uint8 from ``load_omniglot``.
        names: one name per character.
        split_sizes: characters in train, val and test, taken in order; may sum to less than
            ``n_characters`` (the rest is unused).
        rotations: angles (multiples of 90) for the splits in ``rotate_splits``; each (character, angle)
            pair becomes its own class.
        rotate_splits: which splits get rotated classes.

    Returns:
        ``{"train": ..., "val": ..., "test": ...}``: ``TensorImages`` (sharing ``images``' memory), wrapped
        in ``RotatedClasses`` for the splits in ``rotate_splits``.

    Raises:
        ValueError: shapes or names do not match, a split size is negative, the sizes need more
            characters than there are, or a split name is unknown.
    """
    if images.dtype != torch.uint8 or images.dim() != 5:
        raise ValueError(
            f"images must be uint8 of shape (n_characters, n_drawings, C, H, W), got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    if len(names) != images.shape[0]:
        raise ValueError(f"got {len(names)} names for {images.shape[0]} characters")
    if len(split_sizes) != len(SPLIT_NAMES) or any(int(size) < 0 for size in split_sizes):
        raise ValueError(f"split_sizes must be three non-negative counts (train, val, test), got {list(split_sizes)}")
    if sum(split_sizes) > images.shape[0]:
        raise ValueError(
            f"split_sizes {list(split_sizes)} need {sum(split_sizes)} characters but only {images.shape[0]} "
            f"are loaded; make them sum to at most {images.shape[0]} "
            f"(the paper's split is {list(DEFAULT_SPLIT_SIZES)})"
        )
    unknown = sorted(set(rotate_splits) - set(SPLIT_NAMES))
    if unknown:
        raise ValueError(f"rotate_splits must name splits among {list(SPLIT_NAMES)}, got unknown {unknown}")

    per_character = images.shape[1]
    splits: dict[str, FewShotImages] = {}
    start = 0
    for split, size in zip(SPLIT_NAMES, split_sizes, strict=True):
        size = int(size)
        chunk = images[start : start + size]
        split_images = TensorImages(
            chunk.reshape(size * per_character, *images.shape[2:]),
            torch.arange(size).repeat_interleave(per_character),
            names[start : start + size],
            split=split,
        )
        splits[split] = RotatedClasses(split_images, rotations) if split in rotate_splits else split_images
        start += size
    return splits

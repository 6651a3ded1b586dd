"""mini-ImageNet (Vinyals et al. 2016) in the split of Ravi & Larochelle (ICLR 2017): 64 / 16 / 20 classes.

``load_miniimagenet`` reads one split from any of three layouts under ``root``, in this order:

1. the split-folder layout ``{train,val,test}/<wnid>/<image>.jpg`` (folders, or zips of that layout such as
   ``train.zip``), decoded once and cached; when the Ravi & Larochelle CSVs are also present (``root/<split>.csv``
   or ``root/splits/<split>.csv``) the folder's classes must be the CSV's;
2. the original release: ``images/<file>.jpg`` with ``train.csv``, ``val.csv``, ``test.csv`` (``filename,label``),
   decoded once and cached;
3. learn2learn's published caches ``mini-imagenet-cache-{train,validation,test}.pkl``, read with an unpickler
   that rebuilds numpy arrays and nothing else (``array_pickle``); ``download=True`` fetches these from Zenodo.
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from units_lightning.data.datasets.class_images import ClassImages, Decoding, load_labelled_images
from units_lightning.data.datasets.split_layout import SPLIT_NAMES, has_split_layout, load_split_layout, split_locations
from units_lightning.data.io.files import ImageFile, fingerprint

# ImageNet channel statistics, as the authors' code (and MAML++'s) normalises mini-ImageNet.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LEARN2LEARN_MODES = {"train": "train", "val": "validation", "test": "test"}
LEARN2LEARN_URL = "https://zenodo.org/record/7978538/files/mini-imagenet-cache-{mode}.pkl"
_FIX = (
    "mini-ImageNet has no official download: put the Ravi & Larochelle release (images/ with train.csv, "
    "val.csv and test.csv) or the split layout train/ val/ test/ (<split>/<wnid>/<image>, or zips of it) under "
    "root, or pass download=True (on the command line: --data.download true) to fetch learn2learn's cached "
    "pickles (mini-imagenet-cache-{train,validation,test}.pkl, about 1.3 GB) from Zenodo"
)


def csv_path(root: Path, split: str) -> Path | None:
    """The Ravi & Larochelle CSV of ``split`` under ``root`` or ``root/splits``, if any."""
    for folder in (root, root / "splits"):
        if (folder / f"{split}.csv").is_file():
            return folder / f"{split}.csv"
    return None


def read_split_csv(path: Path) -> list[tuple[str, str]]:
    """``(filename, label)`` rows of a Ravi & Larochelle CSV (header ``filename,label``).

    Raises:
        ValueError: the header is not ``filename,label`` or a row has another number of fields.
    """
    with open(path, newline="") as file:
        rows = list(csv.reader(file))
    if not rows or [cell.strip() for cell in rows[0]] != ["filename", "label"]:
        raise ValueError(f"{path}: expected the header 'filename,label' of the Ravi & Larochelle split files")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != 2:
            raise ValueError(f"{path}, line {number}: expected 'filename,label', got {row}")
    return [(row[0].strip(), row[1].strip()) for row in rows[1:]]


def check_csv_classes(split: str, class_names: Sequence[str], csv_file: Path) -> None:
    """Raise ValueError unless ``class_names`` are exactly the labels of the split's CSV."""
    expected = {label for _, label in read_split_csv(csv_file)}
    missing, extra = sorted(expected - set(class_names)), sorted(set(class_names) - expected)
    if missing or extra:
        raise ValueError(
            f"split '{split}' does not follow {csv_file}: missing classes {missing}, unexpected {extra}. "
            "Use FewShotImageFolderDataModule for another class split."
        )


def load_csv_release(root: Path, split: str, decoding: Decoding) -> ClassImages:
    """One split of the original release: ``root/images/<file>`` listed by ``root/<split>.csv``.

    Raises:
        ValueError: a listed image is missing or corrupt (named by its file).
    """
    csv_file = csv_path(root, split)
    assert csv_file is not None
    rows = read_split_csv(csv_file)
    images_dir = root / "images"

    def entries(stack: contextlib.ExitStack) -> list[tuple[str, ImageFile]]:
        listed = []
        for filename, label in rows:
            path = images_dir / filename
            if not path.is_file():
                raise ValueError(f"{path}, listed in {csv_file}, does not exist; {_FIX}")
            listed.append((label, ImageFile((label, filename), str(path), path.read_bytes)))
        return listed

    identity = {"csv": fingerprint(csv_file), "images": fingerprint(images_dir, (".jpg", ".jpeg", ".png"))}
    return load_labelled_images(entries, identity, decoding)


def learn2learn_pickle(root: Path, split: str) -> Path:
    """Where learn2learn keeps the cache of ``split``: ``root/mini-imagenet-cache-<mode>.pkl``."""
    return root / f"mini-imagenet-cache-{LEARN2LEARN_MODES[split]}.pkl"


def download_learn2learn_pickle(root: Path, split: str) -> None:
    """Fetch learn2learn's cache of ``split`` from Zenodo into ``root`` (torchvision's downloader).

    Raises:
        Exception: whatever the download raises (typically a network error offline), with a note.
    """
    from torchvision.datasets.utils import download_url

    target = learn2learn_pickle(root, split)
    try:
        download_url(LEARN2LEARN_URL.format(mode=LEARN2LEARN_MODES[split]), str(root), target.name)
    except Exception as error:
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(f"units_lightning: downloading {target.name} into {root} failed; {_FIX}")
        raise


def read_learn2learn_pickle(path: Path, image_size: int) -> ClassImages:
    """A split from learn2learn's ``{"image_data": (n, 84, 84, 3) uint8, "class_dict": {wnid: [index]}}``.

    Raises:
        ValueError: the file is not in that format.
        pickle.UnpicklingError: the pickle needs anything but numpy arrays and plain containers.
    """
    from units_lightning.data.io.array_pickle import load_array_pickle

    content = load_array_pickle(path)
    if not isinstance(content, dict) or not {"image_data", "class_dict"} <= set(content):
        raise ValueError(f"{path} is not a learn2learn mini-ImageNet cache (no 'image_data' and 'class_dict')")
    pixels, class_dict = np.asarray(content["image_data"]), content["class_dict"]
    if pixels.dtype != np.uint8 or pixels.ndim != 4 or pixels.shape[-1] != 3:
        raise ValueError(f"{path}: 'image_data' should be (n, H, W, 3) uint8, got {pixels.dtype} {pixels.shape}")
    names = sorted(str(name) for name in class_dict)
    indices = [np.asarray(class_dict[name], dtype=np.int64) for name in names]
    picked = pixels[np.concatenate(indices)]
    if picked.shape[1:3] != (image_size, image_size):
        picked = np.stack(
            [np.asarray(Image.fromarray(x).resize((image_size, image_size), Image.Resampling.BICUBIC)) for x in picked]
        )
    labels = torch.arange(len(names)).repeat_interleave(torch.tensor([len(i) for i in indices]))
    return ClassImages(torch.from_numpy(np.ascontiguousarray(picked.transpose(0, 3, 1, 2))), labels, names)


def load_miniimagenet(
    root: str | Path,
    split: str,
    download: bool = False,
    cache_dir: str | Path | None = None,
    image_size: int = 84,
) -> ClassImages:
    """One split of mini-ImageNet as uint8 RGB images (see the module docstring for the layouts).

    Args:
        root: the dataset root.
        split: "train", "val" or "test".
        download: fetch learn2learn's cached pickle of the split from Zenodo when no layout is present.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / "miniimagenet"``.
        image_size: side of the square images (mini-ImageNet's own size is 84).

    Returns:
        (n, 3, image_size, image_size) uint8 images, classes (WordNet ids) sorted.

    Raises:
        FileNotFoundError: no layout under ``root`` and ``download`` is False; the message lists the paths
            tried and the fix.
        ValueError: the classes differ from the CSV split, an archive entry is unsafe, or an image is
            corrupt (named by its file).
        pickle.UnpicklingError: a learn2learn pickle holds anything but arrays and plain containers.
    """
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {list(SPLIT_NAMES)}, got {split!r}")
    root = Path(root).expanduser()
    decoding = Decoding((3, image_size, image_size), cache_dir, "miniimagenet", fix=_FIX)
    if has_split_layout(root):
        images = load_split_layout(root, split, decoding)
        csv_file = csv_path(root, split)
        if csv_file is not None:
            check_csv_classes(split, images.class_names, csv_file)
        return images
    if (root / "images").is_dir() and csv_path(root, split) is not None:
        return load_csv_release(root, split, decoding)
    pickle_file = learn2learn_pickle(root, split)
    if not pickle_file.is_file() and download:
        download_learn2learn_pickle(root, split)
    if pickle_file.is_file():
        return read_learn2learn_pickle(pickle_file, image_size)
    looked = [location for name in SPLIT_NAMES for location in split_locations(root, name)]
    looked += [f"{root / 'images'}/ with {root / split}.csv", str(pickle_file)]
    raise FileNotFoundError(f"mini-ImageNet not found under {root} (looked for {', '.join(looked)}); {_FIX}.")

"""CIFAR-FS (Bertinetto et al., ICLR 2019): the 100 CIFAR-100 classes split 64 / 16 / 20, 600 images each.

``load_cifarfs`` reads one split from the split-folder layout (``root/{train,val,test}/<class>/<image>``, as
folders or zips, see ``split_layout``) and checks its classes against the official split, or arranges
torchvision's CIFAR-100 (downloaded with ``download=True``) into that split. Class lists: the CIFAR-FS split
as published in tristandeleu/pytorch-meta@ac3c48e (MIT).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from units_lightning.data.datasets.class_images import ClassImages, Decoding
from units_lightning.data.datasets.split_layout import SPLIT_NAMES, has_split_layout, load_split_layout, split_locations

CIFARFS_CLASSES: dict[str, tuple[str, ...]] = {
    "train": (
        "apple", "aquarium_fish", "bear", "bee", "bottle", "bowl", "boy", "bridge", "bus", "can", "castle",
        "caterpillar", "chair", "clock", "cloud", "cockroach", "couch", "cup", "dinosaur", "dolphin", "elephant",
        "forest", "girl", "hamster", "house", "kangaroo", "keyboard", "lawn_mower", "lion", "lizard", "lobster",
        "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid", "palm_tree", "pear", "pine_tree", "plate",
        "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "seal", "shrew", "skunk", "skyscraper", "snake",
        "spider", "squirrel", "streetcar", "sunflower", "tank", "tiger", "train", "trout", "tulip", "turtle",
        "willow_tree", "wolf",
    ),
    "val": (
        "beaver", "beetle", "butterfly", "camel", "cattle", "crab", "crocodile", "flatfish", "lamp", "maple_tree",
        "motorcycle", "otter", "sea", "shark", "television", "tractor",
    ),
    "test": (
        "baby", "bed", "bicycle", "chimpanzee", "fox", "leopard", "man", "pickup_truck", "plain", "poppy",
        "rocket", "rose", "snail", "sweet_pepper", "table", "telephone", "wardrobe", "whale", "woman", "worm",
    ),
}  # fmt: skip
IMAGES_PER_CLASS = 600
TORCHVISION_FOLDER = "cifar-100-python"
# Optional normalisation: CIFAR-100's training-set channel statistics. The authors' code feeds CIFAR-FS
# pixels in [0, 1] without normalisation ("cifarfs" matches none of the normalising branches of MAML++'s
# transforms), so the shipped configs leave it off.
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
_FIX = (
    "pass download=True (on the command line: --data.download true) to fetch CIFAR-100 with torchvision "
    "into root and arrange it into the CIFAR-FS split, or point root at a folder holding train/ val/ test/ "
    "(<split>/<class>/<image>) or zips of that layout"
)


def check_cifarfs_classes(split: str, class_names: Sequence[str], source: str) -> None:
    """Raise ValueError unless ``class_names`` are exactly the official CIFAR-FS classes of ``split``."""
    expected = set(CIFARFS_CLASSES[split])
    missing, extra = sorted(expected - set(class_names)), sorted(set(class_names) - expected)
    if missing or extra:
        raise ValueError(
            f"{source}: split '{split}' is not the CIFAR-FS split: missing classes {missing}, unexpected {extra}. "
            "Use FewShotImageFolderDataModule for another class split of CIFAR-100."
        )


def arrange_cifar100(
    images: np.ndarray, targets: Sequence[int], class_names: Sequence[str], split: str, image_size: int = 32
) -> ClassImages:
    """Pick one CIFAR-FS split out of CIFAR-100 arrays.

    Args:
        images: (n, 32, 32, 3) uint8, CIFAR-100's train and test images together.
        targets: (n,) fine label of each image.
        class_names: CIFAR-100's fine label names, indexed by label.
        split: "train", "val" or "test".
        image_size: side of the output images (bicubic resize when not 32).

    Returns:
        The split's images, classes sorted by name, images in their CIFAR-100 order within a class.

    Raises:
        ValueError: a class of the split is not among ``class_names``.
    """
    check_cifarfs_classes(split, [n for n in class_names if n in CIFARFS_CLASSES[split]], "CIFAR-100")
    names = sorted(CIFARFS_CLASSES[split])
    label_of = {name: label for label, name in enumerate(class_names)}
    targets = np.asarray(targets)
    chosen = [np.flatnonzero(targets == label_of[name]) for name in names]
    picked = images[np.concatenate(chosen)]
    if image_size != picked.shape[1]:
        picked = np.stack(
            [np.asarray(Image.fromarray(x).resize((image_size, image_size), Image.Resampling.BICUBIC)) for x in picked]
        )
    labels = torch.arange(len(names)).repeat_interleave(torch.tensor([len(c) for c in chosen]))
    return ClassImages(torch.from_numpy(np.ascontiguousarray(picked.transpose(0, 3, 1, 2))), labels, names)


def load_torchvision_cifar100(root: Path, download: bool, split: str, image_size: int) -> ClassImages:
    """One CIFAR-FS split from torchvision's CIFAR-100 under ``root`` (downloaded there if asked).

    torchvision checks the MD5 of the archive and of each file before it reads them.
    """
    from torchvision.datasets import CIFAR100

    parts = []
    for train in (True, False):
        try:
            parts.append(CIFAR100(str(root), train=train, download=download))
        except Exception as error:
            if hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(
                    f"units_lightning: reading CIFAR-100 with torchvision from {root / TORCHVISION_FOLDER} failed. "
                    "If this machine is offline, put train/ val/ test/ of CIFAR-FS (or its zips) under root."
                )
            raise
    images = np.concatenate([np.asarray(p.data, dtype=np.uint8) for p in parts])
    targets = np.concatenate([np.asarray(p.targets) for p in parts])
    return arrange_cifar100(images, targets, parts[0].classes, split, image_size)


def load_cifarfs(
    root: str | Path,
    split: str,
    download: bool = False,
    cache_dir: str | Path | None = None,
    image_size: int = 32,
) -> ClassImages:
    """One split of CIFAR-FS as uint8 RGB images.

    Looks under ``root`` for, in order: the split-folder layout (folders or zips, decoded once and cached in
    ``cache_dir``), torchvision's ``cifar-100-python/``, and with ``download=True`` fetches the latter.

    Args:
        root: the dataset root.
        split: "train", "val" or "test".
        download: fetch CIFAR-100 with torchvision when neither layout is present.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / "cifarfs"``.
        image_size: side of the square images (CIFAR's own size is 32).

    Returns:
        (n, 3, image_size, image_size) uint8 images of the split's classes (64 / 16 / 20 classes of 600).

    Raises:
        FileNotFoundError: no layout under ``root`` and ``download`` is False; the message lists the paths
            tried and the fix.
        ValueError: the split's classes are not CIFAR-FS's, an archive entry is unsafe, or an image is
            corrupt (named by its file).
    """
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {list(SPLIT_NAMES)}, got {split!r}")
    root = Path(root).expanduser()
    if has_split_layout(root):
        images = load_split_layout(root, split, Decoding((3, image_size, image_size), cache_dir, "cifarfs", fix=_FIX))
        check_cifarfs_classes(split, images.class_names, str(root))
        return images
    if (root / TORCHVISION_FOLDER).is_dir() or download:
        return load_torchvision_cifar100(root, download, split, image_size)
    looked = [location for name in SPLIT_NAMES for location in split_locations(root, name)]
    raise FileNotFoundError(
        f"CIFAR-FS not found under {root} (looked for {', '.join(looked)} and {root / TORCHVISION_FOLDER}/); {_FIX}."
    )

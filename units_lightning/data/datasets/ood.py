"""Out-of-distribution image sets (MNIST, Fashion-MNIST, GTSRB test images), shaped like a training dataset.

An OOD query set must look like the model's input: ``load_ood`` converts and resizes an OOD set to the
target dataset's image shape and normalisation, so that, e.g., MNIST digits become 28x28 grey queries for an
Omniglot model and GTSRB signs or Fashion-MNIST become 32x32 RGB queries for a CIFAR-FS model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from units_lightning.data.datasets.class_images import Decoding, ImageSource, load_class_images
from units_lightning.data.datasets.images import TensorImages

# name -> zip file of the set; its entries are <name>/<class>/<image>.
OOD_SETS = {
    "mnist": "mnist_test.zip",
    "fashion_mnist": "fashion_mnist_test.zip",
    "gtsrb": "gtsrb_test_subset.zip",
}


def load_ood(
    name: str,
    root: str | Path,
    image_shape: Sequence[int] = (1, 28, 28),
    cache_dir: str | Path | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> TensorImages:
    """An out-of-distribution set as a ``TensorImages`` in a target dataset's shape.

    Reads ``root/<name>/<class>/<image>`` or the zip ``root/<OOD_SETS[name]>`` (read in place, every entry
    checked), converts to grey or RGB and resizes (bicubic) to ``image_shape``, and caches the decoded uint8
    tensor like every other dataset. Pass the target dataset's ``mean`` and ``std`` so that ``gather``
    returns inputs normalised as the model's training images are.

    Args:
        name: "mnist", "fashion_mnist" or "gtsrb".
        root: folder holding the set (the shared data's ``ood/``).
        image_shape: the target's (channels, height, width): (1, 28, 28) for Omniglot, (3, 32, 32) for
            CIFAR-FS, (3, 84, 84) for mini-ImageNet.
        cache_dir: where decoded tensors are kept; default ``default_cache_dir() / "ood"``.
        mean, std: the target dataset's per-channel normalisation (None for none).

    Returns:
        ``TensorImages`` with split ``"ood-<name>"``; its classes are the set's own (digits, garment types,
        sign types), which an OOD evaluation usually ignores.

    Raises:
        ValueError: an unknown name, an unsafe archive entry, or a corrupt image (named by its file).
        FileNotFoundError: neither the folder nor the zip is under ``root``.

    Example:
        ``load_ood("gtsrb", "../shared/data/ood", (3, 32, 32)).gather(torch.arange(5))`` gives five
        (3, 32, 32) float images in [0, 1].
    """
    if name not in OOD_SETS:
        raise ValueError(f"unknown OOD set {name!r}; choose one of {sorted(OOD_SETS)}")
    root = Path(root).expanduser()
    folder, archive = root / name, root / OOD_SETS[name]
    if folder.is_dir():
        source = ImageSource(folder)
    elif archive.is_file():
        source = ImageSource(archive, ((name,), ()))
    else:
        raise FileNotFoundError(
            f"OOD set {name!r} not found: looked for {folder}/ and {archive}. Put the folder "
            f"{name}/<class>/<image> (e.g. the official test images saved as PNG) or its zip under {root}."
        )
    decoding = Decoding(tuple(image_shape), cache_dir, "ood", fix=f"re-create {archive.name}")
    images = load_class_images([source], decoding)
    return images.as_split(f"ood-{name}", mean=mean, std=std)

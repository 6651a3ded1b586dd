"""Dataset-specific episodic DataModules: each only says where its splits come from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from units_lightning.data.datasets.images import FewShotImages, RotatedClasses
from units_lightning.data.episodic import EpisodicDataModule

if TYPE_CHECKING:  # the loaders and their readers are imported when a split is made
    from units_lightning.data.datasets.class_images import ClassImages

__all__ = [
    "CIFARFSDataModule",
    "FewShotImageFolderDataModule",
    "FixedSplitDataModule",
    "MiniImageNetDataModule",
    "OmniglotDataModule",
    "SyntheticGlyphsDataModule",
]


class SyntheticGlyphsDataModule(EpisodicDataModule):
    """Episodes of ``SyntheticGlyphs``: procedural Omniglot-like characters, no files, no download.

    The built-in default data: train, val and test use disjoint classes.

    Args:
        train_classes: classes of the train split (val and test get ``eval_classes`` each).
        eval_classes: classes of the val and of the test split.
        images_per_class: drawings per class.
        image_size: side of the square images.
        glyph_seed: seed that defines the classes and drawings.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(
        self,
        train_classes: int = 1000,
        eval_classes: int = 200,
        images_per_class: int = 20,
        image_size: int = 28,
        glyph_seed: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.train_classes, self.eval_classes = train_classes, eval_classes
        self.images_per_class, self.image_size, self.glyph_seed = images_per_class, image_size, glyph_seed
        self.image_shape = (1, image_size, image_size)

    def make_split(self, split: str) -> FewShotImages:
        from units_lightning.data.datasets.synthetic import SyntheticGlyphs

        return SyntheticGlyphs(
            split=split,
            num_classes=self.train_classes if split == "train" else self.eval_classes,
            images_per_class=self.images_per_class,
            image_size=self.image_size,
            seed=self.glyph_seed,
        )


class OmniglotDataModule(EpisodicDataModule):
    """Episodes of Omniglot (1,623 characters x 20 drawings), resized to ``image_size``.

    Characters are ordered background set then evaluation set (alphabets and characters sorted); the first
    1,150 train, the next 50 validate (the paper's 1,150 / 50 split of the usual 1,200 meta-train
    characters), the last 423 test. Train classes are augmented by rotations of k x 90 degrees, per class.

    Args:
        root: folder with ``images_background`` and ``images_evaluation`` (folders or zips), or where
            to download them with ``download: true``.
        download: fetch the data through torchvision if it is missing.
        cache_dir: writable folder for the decoded image tensor (default
            ``$UNITS_LIGHTNING_CACHE`` or ``~/.cache/units-lightning``).
        image_size: side of the resized square images.
        rotations: rotation angles (multiples of 90) that augment the train classes; ``[0]`` for none.
        split_sizes: characters in train, val and test.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(
        self,
        root: str = "data/omniglot",
        download: bool = False,
        cache_dir: str | None = None,
        image_size: int = 28,
        rotations: list[int] | None = None,
        split_sizes: tuple[int, int, int] = (1150, 50, 423),
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.root, self.download, self.cache_dir = Path(root), download, cache_dir
        self.image_size = image_size
        self.rotations = [0, 90, 180, 270] if rotations is None else list(rotations)
        self.split_sizes = tuple(split_sizes)
        self.image_shape = (1, image_size, image_size)
        self._all: dict[str, FewShotImages] | None = None

    def make_split(self, split: str) -> FewShotImages:
        from units_lightning.data.datasets.omniglot import load_omniglot, omniglot_splits

        if self._all is None:
            images, names = load_omniglot(
                self.root, download=self.download, cache_dir=self.cache_dir, image_size=self.image_size
            )
            self._all = omniglot_splits(
                images,
                names,
                split_sizes=self.split_sizes,
                rotations=self.rotations,
                rotate_splits=("train",) if self.rotations != [0] else (),
            )
        return self._all[split]


class FixedSplitDataModule(EpisodicDataModule):
    """Episodes of an RGB dataset whose train / val / test classes are fixed, read one split at a time.

    The shared shell of ``CIFARFSDataModule`` and ``MiniImageNetDataModule``: a subclass names its defaults
    and implements ``load_split`` with its dataset's loader; this class keeps the options and normalises.

    Args:
        root: the dataset root (the layouts each dataset reads: see the subclass).
        download: fetch the data into ``root`` if no layout is found there: for CIFAR-FS, CIFAR-100 through
            torchvision, arranged into the split; for mini-ImageNet, learn2learn's cached pickles from Zenodo
            (read without unpickling anything but arrays).
        cache_dir: writable folder for the decoded image tensors (default ``$UNITS_LIGHTNING_CACHE`` or
            ``~/.cache/units-lightning``).
        image_size: side of the square images.
        mean: per-channel mean subtracted from the [0, 1] pixels; None (CIFAR-FS's default, as the authors' code)
            for none; ``units_lightning.data.datasets.cifarfs.CIFAR100_MEAN`` is CIFAR-100's.
        std: per-channel standard deviation, given with ``mean``.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(
        self,
        root: str,
        download: bool = False,
        cache_dir: str | None = None,
        image_size: int = 32,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.root, self.download, self.cache_dir = Path(root), download, cache_dir
        self.image_size, self.mean, self.std = image_size, mean, std
        self.image_shape = (3, image_size, image_size)

    def load_split(self, split: str) -> ClassImages:
        """The uint8 images of ``split`` ("train", "val" or "test"), from the dataset's loader."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_split(split)")

    def make_split(self, split: str) -> FewShotImages:
        return self.load_split(split).as_split(split, mean=self.mean, std=self.std)


class CIFARFSDataModule(FixedSplitDataModule):
    """Episodes of CIFAR-FS: 64 / 16 / 20 CIFAR-100 classes of 600 RGB images, 32x32.

    With ``download: true`` and no layout under ``root``, CIFAR-100 is fetched through torchvision and arranged
    into the split. Pixels are fed in [0, 1] by default (``mean: null``, the authors' code).

    Args:
        root: folder with ``train/``, ``val/``, ``test/`` (``<split>/<class>/<image>``) or zips of that layout
            (``train-a.zip`` and ``train-b.zip`` both count as train), or with torchvision's
            ``cifar-100-python/``, or where to download the latter with ``download: true``.
        image_size: side of the square images.
        **kwargs: ``download``, ``cache_dir``, ``mean``, ``std`` (see ``FixedSplitDataModule``) and the episode
            options of ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(self, root: str = "data/cifarfs", image_size: int = 32, **kwargs: Any):
        super().__init__(root=root, image_size=image_size, **kwargs)

    def load_split(self, split: str) -> ClassImages:
        from units_lightning.data.datasets.cifarfs import load_cifarfs

        return load_cifarfs(self.root, split, self.download, self.cache_dir, self.image_size)


class MiniImageNetDataModule(FixedSplitDataModule):
    """Episodes of mini-ImageNet in the Ravi & Larochelle split: 64 / 16 / 20 classes, 84x84 RGB.

    With ``download: true`` and no layout under ``root``, learn2learn's cached pickles are fetched from Zenodo
    (read without unpickling anything but arrays).

    Args:
        root: folder with ``train/ val/ test/`` (``<split>/<wnid>/<image>``, folders or zips), or the original
            release (``images/`` with ``train.csv``, ``val.csv``, ``test.csv``), or learn2learn's
            ``mini-imagenet-cache-*.pkl``, or where to download the latter with ``download: true``.
        image_size: side of the square images.
        mean: per-channel mean subtracted from the [0, 1] pixels (default ImageNet's, as the authors' code);
            None for no normalisation.
        std: per-channel standard deviation, given with ``mean``.
        **kwargs: ``download``, ``cache_dir`` (see ``FixedSplitDataModule``) and the episode options of
            ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(
        self,
        root: str = "data/miniimagenet",
        image_size: int = 84,
        mean: tuple[float, float, float] | None = (0.485, 0.456, 0.406),
        std: tuple[float, float, float] | None = (0.229, 0.224, 0.225),
        **kwargs: Any,
    ):
        super().__init__(root=root, image_size=image_size, mean=mean, std=std, **kwargs)

    def load_split(self, split: str) -> ClassImages:
        from units_lightning.data.datasets.miniimagenet import load_miniimagenet

        return load_miniimagenet(self.root, split, self.download, self.cache_dir, self.image_size)


class FewShotImageFolderDataModule(EpisodicDataModule):
    """Episodes of your own images: a folder of class folders, split into train / val / test by class.

    Args:
        root: ``root/<class>/<image>`` (or a zip of that layout); with ``split: folders``,
            ``root/{train,val,test}/<class>/<image>`` (or zips of that layout).
        split: how classes are split: three ratios (train, val, test), assigned at random with
            ``split_seed``; or lists of class names, ``{"train": [...], "val": [...], "test": [...]}``; or
            ``"folders"`` when ``root`` is already split.
        split_seed: seed of the class permutation for ratios.
        image_size: side of the square images (every image is resized to it, bicubic).
        channels: 1 (grey) or 3 (RGB); images are converted.
        mean: per-channel mean subtracted from the [0, 1] pixels, None for none.
        std: per-channel standard deviation, given with ``mean``.
        rotations: rotation angles (multiples of 90) that augment the train classes, per class (as Omniglot);
            None for none.
        cache_dir: writable folder for the decoded image tensor.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, ...).
    """

    def __init__(
        self,
        root: str = "data/images",
        split: tuple[float, float, float] | dict[str, list[str]] | Literal["folders"] = (0.64, 0.16, 0.2),
        split_seed: int = 0,
        image_size: int = 84,
        channels: int = 3,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        rotations: list[int] | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        self.root, self.split_spec, self.split_seed = Path(root), split, split_seed
        self.image_size, self.channels, self.mean, self.std = image_size, channels, mean, std
        self.rotations, self.cache_dir = rotations, cache_dir
        self.image_shape = (channels, image_size, image_size)
        self._classes: dict[str, list[int]] | None = None

    def make_split(self, split: str) -> FewShotImages:
        from units_lightning.data.datasets.class_images import Decoding
        from units_lightning.data.datasets.image_folder import load_image_folder, split_by_lists, split_by_ratios
        from units_lightning.data.datasets.split_layout import load_split_layout

        if self.split_spec == "folders":
            images = load_split_layout(self.root, split, Decoding(self.image_shape, self.cache_dir, "image_folder"))
            chosen = images.as_split(split, mean=self.mean, std=self.std)
        else:
            images = load_image_folder(self.root, self.image_shape, self.cache_dir)
            if self._classes is None:
                if isinstance(self.split_spec, Mapping):
                    self._classes = split_by_lists(images.class_names, self.split_spec)
                else:
                    self._classes = split_by_ratios(len(images.class_names), self.split_spec, self.split_seed)
            if split not in self._classes:
                raise ValueError(f"no '{split}' split: the split lists name only {sorted(self._classes)}")
            chosen = images.as_split(split, self._classes[split], mean=self.mean, std=self.std)
        if self.rotations and split == "train":
            return RotatedClasses(chosen, self.rotations)
        return chosen

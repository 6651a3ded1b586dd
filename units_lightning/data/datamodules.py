"""Dataset-specific episodic DataModules: each only says where its splits come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from units_lightning.data.datamodule import EpisodicDataModule
from units_lightning.data.images import FewShotImages

__all__ = ["OmniglotDataModule", "SyntheticGlyphsDataModule"]


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
        from units_lightning.data.synthetic import SyntheticGlyphs

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
        from units_lightning.data.omniglot import load_omniglot, omniglot_splits

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

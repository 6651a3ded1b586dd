"""``FolderPredictionDataModule``: one task from your own folders, for ``units-lightning predict``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import DataLoader

from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.episode import SealedLabels, TaskBatch

__all__ = ["FolderPredictionDataModule", "load_image"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
_GREY_MODES = {"1", "L", "LA", "I", "I;16", "F", "P"}


def _image_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
    )


def load_image(path: Path, image_size: int, channels: int, invert: bool = False) -> Tensor:
    """One image file as (channels, image_size, image_size) float in [0, 1] (Lanczos resize).

    Raises:
        ValueError: the file is not a readable image (the message names it).
    """
    try:
        with Image.open(path) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            image = image.resize((image_size, image_size), Image.Resampling.LANCZOS)
            pixels = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ValueError(f"cannot read image {path}: {error}") from error
    if invert:
        pixels = 255 - pixels
    tensor = torch.from_numpy(pixels.copy()).float().div_(255.0)
    return tensor[None] if channels == 1 else tensor.permute(2, 0, 1)


class FolderPredictionDataModule(EpisodicDataModule):
    """A task from folders: ``support/<class name>/*.png`` (labelled) and ``query/*.png`` (to predict).

    ``n_way`` is the number of class folders (it must equal the trained model's); images are converted to
    grey or RGB and resized to ``image_size`` like the training data. Queries are predicted as query sets of
    ``query_set_size`` images (default all at once), each after adapting to the support set; the backbone's
    batch norm uses the statistics of the query set, as in training.

    Args:
        support: folder with one subfolder of images per class (the class name is the subfolder's name).
        query: folder of query images (sorted by name).
        image_size: side of the square images the model was trained on.
        channels: 1 (grey) or 3 (RGB); default: 1 if every support image is grey, else 3.
        invert: invert grey levels (Omniglot models see bright strokes on black: give black-on-white drawings
            with ``invert: true``).
        query_set_size: queries per predicted query set.

    Raises:
        ValueError: a missing folder, a class folder without images, no query images, an unreadable image.
    """

    def __init__(
        self,
        support: str,
        query: str,
        image_size: int = 28,
        channels: int | None = None,
        invert: bool = False,
        query_set_size: int | None = None,
    ):
        support_root, query_root = Path(support), Path(query)
        for name, folder in (("support", support_root), ("query", query_root)):
            if not folder.is_dir():
                raise ValueError(f"{name} folder {folder} does not exist or is not a folder")
        class_folders = sorted(p for p in support_root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(class_folders) < 2:
            raise ValueError(
                f"support folder {support_root} needs one subfolder per class (at least 2), got {len(class_folders)}"
            )
        self.support_files = {folder.name: _image_files(folder) for folder in class_folders}
        empty = [name for name, files in self.support_files.items() if not files]
        if empty:
            raise ValueError(f"class folders without images in {support_root}: {empty}")
        self.query_files = _image_files(query_root)
        if not self.query_files:
            raise ValueError(f"no query images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {query_root}")
        if query_set_size is not None and query_set_size < 1:
            raise ValueError(f"query_set_size must be >= 1, got {query_set_size}")
        super().__init__(n_way=len(class_folders), k_shot=1, query_shots=1)
        self.class_names = [folder.name for folder in class_folders]
        self.channels = channels if channels is not None else self._guess_channels()
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")
        self.image_size, self.invert, self.query_set_size = image_size, invert, query_set_size
        self.image_shape = (self.channels, image_size, image_size)
        self._batches: list[TaskBatch] | None = None

    def _guess_channels(self) -> int:
        for files in self.support_files.values():
            for path in files:
                try:
                    with Image.open(path) as image:
                        if image.mode not in _GREY_MODES:
                            return 3
                except (UnidentifiedImageError, OSError) as error:
                    raise ValueError(f"cannot read image {path}: {error}") from error
        return 1

    def _load(self, paths: list[Path]) -> Tensor:
        return torch.stack([load_image(p, self.image_size, self.channels, self.invert) for p in paths])

    def setup(self, stage: str | None = None) -> None:
        if stage not in (None, "predict"):
            raise ValueError(f"FolderPredictionDataModule serves `predict` only, not `{stage}`")
        if self._batches is not None:
            return
        support_paths = [p for files in self.support_files.values() for p in files]
        support_y = torch.tensor([c for c, files in enumerate(self.support_files.values()) for _ in files])
        support_x = self._load(support_paths)
        query_x = self._load(self.query_files)
        size = self.query_set_size or len(self.query_files)
        classes = torch.arange(self.n_way)[None]
        self._batches = []
        for index, start in enumerate(range(0, len(self.query_files), size)):
            chunk = query_x[start : start + size]
            self._batches.append(
                TaskBatch(
                    support_x=support_x[None],
                    support_y=support_y[None],
                    query_x=chunk[None, None],
                    query_y=SealedLabels(torch.full((1, 1, len(chunk)), -1)),
                    classes=classes,
                    step=index,
                )
            )

    def predict_dataloader(self) -> DataLoader:
        if self._batches is None:
            self.setup("predict")
        return DataLoader(self._batches, batch_size=None, collate_fn=_as_is)


def _as_is(batch: TaskBatch) -> TaskBatch:
    return batch

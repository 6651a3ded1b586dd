"""Class-indexed image collections: the only thing the episodic machinery needs from a dataset."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset


class FewShotImages(Dataset):
    """A split of a few-shot dataset: images grouped by class, addressed by flat index.

    Subclasses set ``labels`` (one class id per image, ids contiguous from 0) and implement ``gather``.
    Task samplers read ``labels`` only and never load an image; the episode builder calls ``gather``
    with the indices a sampler drew.

    Attributes:
        labels: (n_images,) int64 class id of every image, in ``0 .. num_classes - 1``.
        class_names: one readable name per class id (used in error messages and reports).
        image_shape: (channels, height, width) of what ``gather`` returns.
        split: name of the split ("train", "val", "test"), for error messages.
    """

    labels: Tensor
    class_names: list[str]
    image_shape: tuple[int, int, int]
    split: str = "train"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return int(self.labels.numel())

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.gather(torch.tensor([index]))[0], int(self.labels[index])

    def gather(self, indices: Tensor) -> Tensor:
        """Images at ``indices`` as float32 in [0, 1], shape (len(indices), C, H, W)."""
        raise NotImplementedError


class TensorImages(FewShotImages):
    """Images held in memory as one uint8 tensor, decoded once.

    Args:
        images: (n, C, H, W) uint8.
        labels: (n,) class ids, contiguous from 0.
        class_names: names of the classes, ``len == labels.max() + 1``.
        split: split name for messages.

    Example:
        >>> images = torch.zeros(6, 1, 4, 4, dtype=torch.uint8)
        >>> ds = TensorImages(images, torch.tensor([0, 0, 1, 1, 2, 2]), ["a", "b", "c"])
        >>> ds.num_classes, ds.gather(torch.tensor([0, 5])).shape
        (3, torch.Size([2, 1, 4, 4]))
    """

    def __init__(self, images: Tensor, labels: Tensor, class_names: Sequence[str], split: str = "train"):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 of shape (n, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}")
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= len(class_names)):
            raise ValueError(
                f"labels must lie in [0, {len(class_names)}), got [{int(labels.min())}, {int(labels.max())}]"
            )
        self.images = images
        self.labels = labels.long()
        self.class_names = list(class_names)
        self.image_shape = tuple(images.shape[1:])  # type: ignore[assignment]
        self.split = split

    def gather(self, indices: Tensor) -> Tensor:
        return self.images[indices].float().div_(255.0)


class RotatedClasses(FewShotImages):
    """Class augmentation by rotation: every class of ``base`` becomes ``len(rotations)`` classes.

    Each new class is one (class, rotation) pair, so the rotation applies per class, never per task
    (learn2learn's ``RandomClassRotation`` rotates a whole task at once). Class ``c * R + r`` is class
    ``c`` rotated by ``rotations[r]`` degrees.

    Args:
        base: the split to augment.
        rotations: angles in degrees, multiples of 90.
    """

    def __init__(self, base: FewShotImages, rotations: Sequence[int] = (0, 90, 180, 270)):
        if not rotations or any(r % 90 for r in rotations):
            raise ValueError(f"rotations must be a non-empty list of multiples of 90 degrees, got {list(rotations)}")
        self.base = base
        self.rotations = [int(r) % 360 for r in rotations]
        num_rot = len(self.rotations)
        n = len(base)
        # Image i of the rotated set is base image i // R seen under rotation i % R.
        self.labels = base.labels.repeat_interleave(num_rot) * num_rot + torch.arange(num_rot).repeat(n)
        self.class_names = [f"{name}@{r}" for name in base.class_names for r in self.rotations]
        self.image_shape = base.image_shape
        self.split = base.split

    def gather(self, indices: Tensor) -> Tensor:
        num_rot = len(self.rotations)
        images = self.base.gather(indices // num_rot)
        quarter_turns = torch.tensor([self.rotations[int(r)] // 90 for r in indices % num_rot])
        for k in quarter_turns.unique().tolist():
            if k:
                mask = quarter_turns == k
                images[mask] = torch.rot90(images[mask], k, dims=(-2, -1))
        return images

"""Class-indexed image collections: the only thing the episodic machinery needs from a dataset."""

from __future__ import annotations

import copy
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

    def to(self, device: torch.device | str) -> FewShotImages:
        """This collection with its pixels kept on ``device``, so that ``gather`` builds batches there (no copy of
        the batch per step). The base class, and collections that decode files per batch, return themselves."""
        return self


class TensorImages(FewShotImages):
    """Images held in memory as one uint8 tensor, decoded once.

    ``gather`` turns the uint8 pixels into float32 on the fly: ``x / 255``, then ``(x - mean) / std`` per
    channel when ``mean`` and ``std`` are given (one fused multiply-add per pixel), so the kept tensor stays
    four times smaller than its float copy and can be shared with data-loader workers.

    Args:
        images: (n, C, H, W) uint8.
        labels: (n,) class ids, contiguous from 0.
        class_names: names of the classes, ``len == labels.max() + 1``.
        split: split name for messages.
        mean: per-channel mean of the [0, 1] pixels to subtract (length C), or None for no normalisation.
        std: per-channel standard deviation to divide by (length C, > 0); given with ``mean``.

    Raises:
        ValueError: shapes or dtypes do not match, or ``mean``/``std`` are inconsistent.

    Example:
        >>> images = torch.full((6, 1, 4, 4), 255, dtype=torch.uint8)
        >>> ds = TensorImages(images, torch.tensor([0, 0, 1, 1, 2, 2]), ["a", "b", "c"])
        >>> ds.num_classes, ds.gather(torch.tensor([0, 5])).shape
        (3, torch.Size([2, 1, 4, 4]))
        >>> TensorImages(images, ds.labels, ds.class_names, mean=[0.5], std=[0.25]).gather(torch.tensor([0])).max()
        tensor(2.)
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        class_names: Sequence[str],
        split: str = "train",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ):
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
        self.mean, self.std = check_normalization(mean, std, images.shape[1])
        if self.mean is None or self.std is None:
            self._scale, self._shift = None, None
        else:
            # (x / 255 - mean) / std  ==  x * scale - shift
            std_tensor = torch.tensor(self.std, dtype=torch.float32).reshape(-1, 1, 1)
            self._scale = 1.0 / (255.0 * std_tensor)
            self._shift = torch.tensor(self.mean, dtype=torch.float32).reshape(-1, 1, 1) / std_tensor

    def to(self, device: torch.device | str) -> TensorImages:
        moved = copy.copy(self)
        moved.images = self.images.to(device)
        if self._scale is not None and self._shift is not None:
            moved._scale, moved._shift = self._scale.to(device), self._shift.to(device)
        return moved

    def gather(self, indices: Tensor) -> Tensor:
        pixels = self.images[_on(indices, self.images.device)].float()
        if self._scale is None or self._shift is None:
            return pixels.div_(255.0)
        return pixels.mul_(self._scale).sub_(self._shift)


def _on(indices: Tensor, device: torch.device) -> Tensor:
    """``indices`` on ``device``; to a GPU through page-locked memory, so that the copy does not wait for the GPU."""
    if indices.device == device:
        return indices
    return indices.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else indices.to(device)


def check_normalization(
    mean: Sequence[float] | None, std: Sequence[float] | None, channels: int
) -> tuple[list[float] | None, list[float] | None]:
    """Validate a per-channel normalisation: both None, or both of length ``channels`` with ``std > 0``.

    Returns:
        ``(mean, std)`` as lists of floats (or ``(None, None)``).

    Raises:
        ValueError: only one is given, a length differs from ``channels``, or a std is not positive.
    """
    if mean is None and std is None:
        return None, None
    if mean is None or std is None:
        raise ValueError(f"give both mean and std for normalisation, or neither; got mean={mean}, std={std}")
    mean, std = [float(m) for m in mean], [float(s) for s in std]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"mean and std need one value per channel ({channels}), got mean={mean}, std={std}")
    if min(std) <= 0:
        raise ValueError(f"std must be positive, got {std}")
    return mean, std


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
        self._quarter_turns = torch.tensor([r // 90 for r in self.rotations])
        num_rot = len(self.rotations)
        n = len(base)
        # Image i of the rotated set is base image i // R seen under rotation i % R.
        self.labels = base.labels.repeat_interleave(num_rot) * num_rot + torch.arange(num_rot).repeat(n)
        self.class_names = [f"{name}@{r}" for name in base.class_names for r in self.rotations]
        self.image_shape = base.image_shape
        self.split = base.split

    def to(self, device: torch.device | str) -> RotatedClasses:
        base = self.base.to(device)
        if base is self.base:
            return self
        moved = copy.copy(self)
        moved.base, moved._quarter_turns = base, self._quarter_turns.to(device)
        return moved

    def gather(self, indices: Tensor) -> Tensor:
        num_rot = len(self.rotations)
        images = self.base.gather(indices // num_rot)
        quarter_turns = self._quarter_turns[_on(indices % num_rot, self._quarter_turns.device)]
        if images.is_cuda:  # every turn of every image, the right one picked: no read of which turns occur
            for k in range(1, 4):
                turned = (quarter_turns == k).view(-1, *([1] * (images.dim() - 1)))
                images = torch.where(turned, torch.rot90(images, k, dims=(-2, -1)), images)
            return images
        for k in quarter_turns.unique().tolist():
            if k:
                mask = quarter_turns == k
                images[mask] = torch.rot90(images[mask], k, dims=(-2, -1))
        return images

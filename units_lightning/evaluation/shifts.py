"""Shifted query sets for out-of-distribution probes: rotated, scaled, or drawn from another dataset.

A ``QueryShift`` turns a task's query set into shifted versions, one per level (an angle, a factor, a
dataset). Only the query set changes: the model still adapts to the unchanged support set, as in the
paper's Omniglot rotation and scaling study and its CIFAR-FS / mini-ImageNet OOD query sets. Each shifted
query set is predicted as a query set of its own, because the backbone's batch norm uses query-set
statistics (transductive): mixing shifted and clean queries in one pass would change the clean ones' outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from units_lightning.data.datasets.images import FewShotImages
from units_lightning.data.datasets.ood import load_ood

__all__ = ["ForeignQueries", "QueryShift", "Rotation", "Scale", "match_image_shape"]


class QueryShift:
    """A family of query-set shifts, one per level.

    Subclasses set ``kind`` and implement ``shift``. ``keeps_labels`` says whether the shifted queries keep
    their classes (rotations and scalings do, so their accuracy is reported; queries from another dataset
    belong to no class of the task).

    Args:
        levels: the levels to probe (angles, factors, dataset names).
    """

    kind: str = "shift"
    keeps_labels: bool = True

    def __init__(self, levels: Sequence[float | str]):
        if not len(levels):
            raise ValueError(f"{type(self).__name__} needs at least one level")
        self.levels = list(levels)

    def name(self, level: float | str) -> str:
        """Stable name of one level, used in logged keys and ``results.json`` (e.g. ``rotation_30``)."""
        return f"{self.kind}_{level:g}" if isinstance(level, (int, float)) else f"{self.kind}_{level}"

    def is_identity(self, level: float | str) -> bool:
        """Whether the level leaves the queries unchanged (its predictions are then the clean ones)."""
        return False

    def shift(self, query_x: Tensor, level: float | str, generator: torch.Generator) -> Tensor:
        """The shifted query sets.

        Args:
            query_x: (T, M, C, H, W) query images of T tasks, in [0, 1].
            level: one of ``levels``.
            generator: CPU generator for random draws, seeded by the caller per batch of tasks.

        Returns:
            (T, M, C, H, W) shifted queries.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(levels={self.levels})"


def _per_image(query_x: Tensor, transform) -> Tensor:
    images = query_x.flatten(0, 1)
    return transform(images).reshape(query_x.shape)


class Rotation(QueryShift):
    """Query images rotated by each angle (degrees, counter-clockwise), bilinear, corners filled with ``fill``.

    Multiples of 90 degrees are exact (``torch.rot90``, turning the same way). The support set stays upright, so
    accuracy can fall below chance: a glyph turned by 90 degrees looks most like another class's support
    (docs/RESULTS.md, "Rotated queries score below chance").

    Args:
        angles: the angles to probe (the paper: 0 to 180 degrees).
        fill: value of the pixels rotated in from outside (0: the background of Omniglot and MNIST as loaded).
    """

    kind = "rotation"

    def __init__(self, angles: Sequence[float] = (0, 30, 60, 90, 120, 150, 180), fill: float = 0.0):
        super().__init__([float(a) for a in angles])
        self.fill = fill

    def is_identity(self, level: float | str) -> bool:
        return float(level) % 360 == 0

    def shift(self, query_x: Tensor, level: float | str, generator: torch.Generator) -> Tensor:
        angle = float(level)
        if angle % 90 == 0:  # exact, no interpolation blur
            return torch.rot90(query_x, int(angle // 90) % 4, dims=(-2, -1))
        return _per_image(
            query_x, lambda x: TF.rotate(x, angle, interpolation=InterpolationMode.BILINEAR, fill=self.fill)
        )


class Scale(QueryShift):
    """Query images zoomed by each factor about their centre (< 1 shrinks, > 1 enlarges and crops).

    Args:
        factors: the scale factors to probe.
        fill: value of the pixels that come in from outside when shrinking.
    """

    kind = "scale"

    def __init__(self, factors: Sequence[float] = (0.5, 0.75, 1.0, 1.25, 1.5), fill: float = 0.0):
        factors = [float(f) for f in factors]
        if any(f <= 0 for f in factors):
            raise ValueError(f"scale factors must be > 0, got {factors}")
        super().__init__(factors)
        self.fill = fill

    def is_identity(self, level: float | str) -> bool:
        return float(level) == 1.0

    def shift(self, query_x: Tensor, level: float | str, generator: torch.Generator) -> Tensor:
        factor = float(level)
        return _per_image(
            query_x,
            lambda x: TF.affine(
                x,
                angle=0.0,
                translate=[0.0, 0.0],
                scale=factor,
                shear=[0.0, 0.0],
                interpolation=InterpolationMode.BILINEAR,
                fill=self.fill,
            ),
        )


def match_image_shape(images: Tensor, image_shape: Sequence[int]) -> Tensor:
    """Images converted to ``image_shape``: grey <-> RGB (channel mean / repeat) and resized (bilinear, antialiased).

    Args:
        images: (n, C, H, W) float in [0, 1].
        image_shape: (C', H', W') wanted.

    Example:
        >>> match_image_shape(torch.rand(2, 3, 32, 32), (1, 28, 28)).shape
        torch.Size([2, 1, 28, 28])
    """
    channels, height, width = (int(s) for s in image_shape)
    if images.shape[1] != channels:
        if channels == 1:
            images = images.mean(dim=1, keepdim=True)
        elif images.shape[1] == 1:
            images = images.expand(-1, channels, -1, -1)
        else:
            raise ValueError(f"cannot convert {images.shape[1]}-channel images to {channels} channels")
    if tuple(images.shape[-2:]) != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return images.clamp(0.0, 1.0).contiguous()


class ForeignQueries(QueryShift):
    """Query sets replaced by images of another dataset (e.g. MNIST digits for an Omniglot model).

    Each task's query set is replaced by as many images drawn at random (seeded) from the foreign dataset,
    converted to the model's image shape. They belong to no class of the task, so only vacuity and its
    AUROC against the clean queries are reported.

    Args:
        datasets: names of the foreign datasets (levels), e.g. ``["mnist"]``; each is loaded from ``root`` by
            ``units_lightning.data.datasets.ood.load_ood`` unless given in ``images``.
        root: folder with the out-of-distribution archives (e.g. ``mnist_test.zip``).
        images: ready collections by name (Python use and tests), instead of loading.
        cache_dir: where decoded images are cached (default: ``$UNITS_LIGHTNING_CACHE``).
    """

    kind = "dataset"
    keeps_labels = False

    def __init__(
        self,
        datasets: Sequence[str] = ("mnist",),
        root: str | None = None,
        images: Mapping[str, FewShotImages] | None = None,
        cache_dir: str | None = None,
    ):
        super().__init__([str(d) for d in datasets])
        self.root, self.cache_dir = root, cache_dir
        self._images: dict[str, FewShotImages] = dict(images or {})
        missing = [name for name in self.levels if name not in self._images]
        if missing and root is None:
            raise ValueError(f"ForeignQueries: give root (the folder of the OOD archives) to load {missing}")

    def name(self, level: float | str) -> str:
        return str(level)

    def source(self, name: str, image_shape: Sequence[int]) -> FewShotImages:
        """The foreign collection ``name``, loaded on first use."""
        if name not in self._images:
            self._images[name] = load_ood(name, self.root, image_shape=tuple(image_shape), cache_dir=self.cache_dir)
        return self._images[name]

    def shift(self, query_x: Tensor, level: float | str, generator: torch.Generator) -> Tensor:
        num_tasks, num_queries = query_x.shape[:2]
        images = self.source(str(level), query_x.shape[2:])
        index = torch.randint(len(images), (num_tasks * num_queries,), generator=generator)
        drawn = match_image_shape(images.gather(index), query_x.shape[2:])
        return drawn.to(query_x).reshape(query_x.shape)


def default_shifts() -> list[QueryShift]:
    """The probes ``test`` runs unless configured: rotations 0-180 degrees and scales 0.5-1.5."""
    return [Rotation(), Scale()]

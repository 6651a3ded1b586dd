"""SyntheticGlyphs: an Omniglot-like dataset drawn procedurally, needing no files and no download.

Every class is a "character" made of 2-4 smooth pen strokes (cubic Bezier curves); every image of a
class is that character drawn again with a slightly unsteady hand: control points jittered, another pen
width, a small rotation, scaling and shift. Class ``c`` of a split is fully determined by
``(seed, global class id)`` and image ``i`` by ``(seed, global class id, i)``, through a counter-based
hash, so any image can be drawn on its own, in any order, in any process, and always comes out the same.
The splits draw from disjoint ranges of global class ids, so no character is shared between them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from units_lightning.data.datasets.images import FewShotImages

# First global class id of each split; a split may hold at most CLASS_ID_STRIDE classes.
CLASS_ID_STRIDE = 100_000
SPLIT_CLASS_OFFSETS = {"train": 0, "val": CLASS_ID_STRIDE, "test": 2 * CLASS_ID_STRIDE}
DEFAULT_NUM_CLASSES = {"train": 1000, "val": 200, "test": 200}

MAX_STROKES = 4
# Geometry is defined on a 28-pixel reference canvas and scaled with ``image_size``.
REFERENCE_SIZE = 28
STROKE_WIDTH_RANGE = (1.2, 2.5)  # reference pixels
CONTROL_POINT_JITTER = 0.025  # standard deviation, fraction of the canvas
MAX_ROTATION_DEGREES = 10.0
SCALE_RANGE = (0.9, 1.1)
MAX_SHIFT = 2.0  # reference pixels
# Curve samples per reference pixel of canvas width: spacing well under a pixel on any stroke we draw.
SAMPLES_PER_PIXEL = 1.5

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_CLASS_STREAM = np.uint64(0xC1A55)
_IMAGE_STREAM = np.uint64(0x1A6E)

# Uniform draws per class and per image (their layout: see class_geometry and image_pose).
_CLASS_DRAWS = 2 + MAX_STROKES * 8
_FIT_SAMPLES = 17
_IMAGE_DRAWS = MAX_STROKES * 4 * 2 + 1 + 1 + 1 + 2


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective 64-bit mix in which every input bit affects every output bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _combine(key: np.ndarray, value: np.ndarray | int) -> np.ndarray:
    """Hash of the pair (key, value), both read as uint64."""
    with np.errstate(over="ignore"):
        return _splitmix64(key ^ _splitmix64(np.asarray(value).astype(np.uint64) + _GOLDEN))


def hashed_uniform(keys: np.ndarray, n: int) -> Tensor:
    """``n`` independent uniforms in [0, 1) for each key, a pure function of the key.

    Args:
        keys: (B,) uint64 keys.
        n: number of draws per key.

    Returns:
        (B, n) float64 tensor.
    """
    counters = np.arange(n, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        bits = _splitmix64(keys[:, None] + (counters + np.uint64(1)) * _GOLDEN)
    # The top 53 bits give an exactly representable float64 in [0, 1).
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53))


def class_keys(seed: int, global_class_ids: Tensor) -> np.ndarray:
    """(B,) uint64 hash keys of classes: the identity of a character."""
    seed_key = _splitmix64(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    return _combine(_combine(seed_key, global_class_ids.numpy()), _CLASS_STREAM)


def image_keys(seed: int, global_class_ids: Tensor, image_ids: Tensor) -> np.ndarray:
    """(B,) uint64 hash keys of images: one drawing of a character."""
    seed_key = _splitmix64(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    per_class = _combine(_combine(seed_key, global_class_ids.numpy()), _IMAGE_STREAM)
    return _combine(per_class, image_ids.numpy())


def bezier_basis(num_samples: int) -> Tensor:
    """Cubic Bernstein polynomials at ``num_samples`` evenly spaced t in [0, 1]: (num_samples, 4)."""
    t = torch.linspace(0.0, 1.0, num_samples, dtype=torch.float64)[:, None]
    k = torch.arange(4, dtype=torch.float64)
    binomial = torch.tensor([1.0, 3.0, 3.0, 1.0], dtype=torch.float64)
    return binomial * t**k * (1 - t) ** (3 - k)


def bezier_curves(basis: Tensor, controls: Tensor) -> Tensor:
    """Points of cubic Bezier curves.

    Written as element-wise products and sums, not a matrix product, so a curve's points are bit-for-bit
    the same whatever else is in the batch (BLAS kernels may block differently for different sizes).

    Args:
        basis: (T, 4) from ``bezier_basis``.
        controls: (..., 4, 2) control points.

    Returns:
        (..., T, 2) points.
    """
    terms = [basis[:, k, None] * controls[..., k, None, :] for k in range(4)]
    return terms[0] + terms[1] + terms[2] + terms[3]


def class_geometry(uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """The strokes of characters, from their class draws.

    A stroke runs from a start point (fresh, or with probability 1/2 the end of the previous stroke, so
    strokes join the way pen strokes do) in a random direction for 0.3-0.6 of the canvas; its two inner
    control points sit at 1/3 and 2/3 of the chord, pushed sideways independently (arcs and S-curves).
    The character is then scaled so that its larger side spans 0.55-0.8 of the canvas, and centred.

    Args:
        uniforms: (B, _CLASS_DRAWS) float64 in [0, 1).

    Returns:
        control_points: (B, MAX_STROKES, 4, 2) float64, canvas coordinates in [0, 1] (x right, y down).
        active: (B, MAX_STROKES) bool, the first 2-4 strokes of each character.
    """
    batch = uniforms.shape[0]
    num_strokes = 2 + (uniforms[:, 0] * 3).long().clamp(max=2)
    active = torch.arange(MAX_STROKES)[None, :] < num_strokes[:, None]
    target_extent = 0.55 + 0.25 * uniforms[:, 1]
    draws = uniforms[:, 2:].reshape(batch, MAX_STROKES, 8)
    controls = torch.empty(batch, MAX_STROKES, 4, 2, dtype=torch.float64)
    previous_end = None
    for s in range(MAX_STROKES):
        u = draws[:, s]
        start = 0.2 + 0.6 * u[:, 0:2]
        if previous_end is not None:
            start = torch.where((u[:, 2] < 0.5)[:, None], previous_end, start)
        angle = 2 * math.pi * u[:, 3]
        length = 0.3 + 0.3 * u[:, 4]
        direction = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)
        end = start + length[:, None] * direction
        chord = end - start
        normal = torch.stack([-chord[:, 1], chord[:, 0]], dim=-1)
        controls[:, s, 0] = start
        controls[:, s, 1] = start + chord / 3 + (u[:, 5, None] - 0.5) * normal
        controls[:, s, 2] = start + 2 * chord / 3 + (u[:, 6, None] - 0.5) * normal
        controls[:, s, 3] = end
        previous_end = end
    # Fit the bounding box of the drawn curves (not of the control points, which may lie off the curve).
    curves = bezier_curves(bezier_basis(_FIT_SAMPLES), controls)  # (B, MAX_STROKES, T, 2)
    big = torch.tensor(float("inf"), dtype=torch.float64)
    drawn = active[:, :, None, None]
    low = torch.where(drawn, curves, big).amin(dim=(1, 2))
    high = torch.where(drawn, curves, -big).amax(dim=(1, 2))
    scale = target_extent / (high - low).amax(dim=1).clamp(min=1e-6)
    centre = (low + high) / 2
    controls = (controls - centre[:, None, None, :]) * scale[:, None, None, None] + 0.5
    return controls, active


def image_pose(uniforms: Tensor, controls: Tensor, image_size: int) -> tuple[Tensor, Tensor]:
    """One drawing of each character: jittered, re-posed control points and a pen width.

    Args:
        uniforms: (B, _IMAGE_DRAWS) float64 in [0, 1).
        controls: (B, MAX_STROKES, 4, 2) control points of the characters, canvas coordinates.
        image_size: side of the image in pixels.

    Returns:
        points: (B, MAX_STROKES, 4, 2) control points in pixel coordinates (pixel j's centre at j).
        width: (B,) pen width in pixels.
    """
    batch = uniforms.shape[0]
    pixel = 1.0 / REFERENCE_SIZE  # one reference pixel as a fraction of the canvas
    jitter_draws = uniforms[:, : MAX_STROKES * 8].reshape(batch, MAX_STROKES, 4, 2)
    # Box-Muller: pairs of uniforms -> standard normals (1 - u avoids log(0)).
    radius = torch.sqrt(-2 * torch.log1p(-jitter_draws[..., 0]))
    theta = 2 * math.pi * jitter_draws[..., 1]
    noise = torch.stack([radius * torch.cos(theta), radius * torch.sin(theta)], dim=-1)
    points = controls + CONTROL_POINT_JITTER * noise

    rest = uniforms[:, MAX_STROKES * 8 :]
    low_width, high_width = STROKE_WIDTH_RANGE
    width = (low_width + (high_width - low_width) * rest[:, 0]) * image_size / REFERENCE_SIZE
    angle = math.radians(MAX_ROTATION_DEGREES) * (2 * rest[:, 1] - 1)
    scale = SCALE_RANGE[0] + (SCALE_RANGE[1] - SCALE_RANGE[0]) * rest[:, 2]
    shift = MAX_SHIFT * pixel * (2 * rest[:, 3:5] - 1)
    cos = (torch.cos(angle) * scale)[:, None, None]
    sin = (torch.sin(angle) * scale)[:, None, None]
    # An affine map of the control points is the same map of the curve (Bezier curves are affine-invariant).
    x, y = points[..., 0] - 0.5, points[..., 1] - 0.5
    moved_x = cos * x - sin * y + 0.5 + shift[:, 0, None, None]
    moved_y = sin * x + cos * y + 0.5 + shift[:, 1, None, None]
    return torch.stack([moved_x, moved_y], dim=-1) * image_size - 0.5, width


def rasterise(points: Tensor, active: Tensor, width: Tensor, image_size: int, max_width: float) -> Tensor:
    """Draw strokes with a round, anti-aliased pen ``width`` pixels wide.

    A pixel at distance ``d`` from the stroke's centre line gets ``clamp(width / 2 - d + 0.5, 0, 1)``:
    fully lit inside the pen, fading to 0 over one pixel at its edge. Each stroke is sampled densely
    (``SAMPLES_PER_PIXEL``); every sample stamps the pixels within the pen's reach (a small window around
    it) and a pixel keeps its brightest stamp, i.e. the distance to the nearest sample. The cost grows with
    the number of samples, not with samples x pixels.

    Args:
        points: (B, MAX_STROKES, 4, 2) control points in pixel coordinates (pixel j's centre at j).
        active: (B, MAX_STROKES) which strokes to draw.
        width: (B,) pen width in pixels, at most ``max_width``.
        image_size: side of the square image.
        max_width: bound on ``width``; it fixes the stamp window, so a drawing never depends on the batch.

    Returns:
        (B, image_size, image_size) float32 in [0, 1].
    """
    batch = points.shape[0]
    num_samples = max(8, math.ceil(SAMPLES_PER_PIXEL * image_size))
    basis = bezier_basis(num_samples).to(torch.float32)
    image_of_stroke = torch.arange(batch)[:, None].expand(batch, MAX_STROKES)[active]  # (S,)
    curves = bezier_curves(basis, points[active].to(torch.float32))  # (S, T, 2)
    samples = curves.reshape(-1, 2)
    sample_image = image_of_stroke.repeat_interleave(num_samples)
    lit_radius = (width.to(torch.float32) / 2 + 0.5)[sample_image]  # distance at which light reaches 0

    # A pixel at offset o from the sample's nearest pixel is more than |o| - 0.5 away from the sample,
    # so offsets up to ceil(max_width / 2 + 1) - 1 can be lit. The canvas gets a margin of that reach, so
    # every stamp lands on it without bounds checks; samples off the canvas are stamped at its edge, where
    # their true distance leaves the pixels dark.
    reach = math.ceil(max_width / 2 + 1.0) - 1
    padded = image_size + 2 * reach
    offsets = torch.arange(-reach, reach + 1)
    nearest = samples.round().clamp_(0, image_size - 1)
    to_x = nearest[:, 0] - samples[:, 0]  # (N,) from the sample to its nearest pixel
    to_y = nearest[:, 1] - samples[:, 1]
    dx = to_x[:, None, None] + offsets[None, None, :].to(torch.float32)  # (N, 1, K)
    dy = to_y[:, None, None] + offsets[None, :, None].to(torch.float32)  # (N, K, 1)
    intensity = (lit_radius[:, None, None] - (dx * dx + dy * dy).sqrt_()).clamp_(0.0, 1.0)  # (N, K, K)
    nearest = nearest.long() + reach
    corner = (sample_image * padded + nearest[:, 1]) * padded + nearest[:, 0]  # (N,)
    window = offsets[:, None] * padded + offsets[None, :]  # (K, K) flat offsets, rows are y
    canvas = torch.zeros(batch * padded * padded)
    stamped = (corner[:, None, None] + window).reshape(-1)
    canvas.scatter_reduce_(0, stamped, intensity.reshape(-1), reduce="amax")
    return canvas.reshape(batch, padded, padded)[:, reach : reach + image_size, reach : reach + image_size]


class SyntheticGlyphs(FewShotImages):
    """Procedural handwritten-character-like classes, the built-in default dataset (no files needed).

    Image ``index`` is image ``index % images_per_class`` of class ``index // images_per_class``. Images are
    drawn on demand (about 5 ms per 100 images on one core at 28 px), quantised to uint8 like a
    real image file, and (with ``cache=True``) kept, so a second epoch costs what an in-memory dataset costs.

    Args:
        split: "train", "val" or "test"; the splits use disjoint characters.
        num_classes: characters in the split; default 1000 for train, 200 for val and test. At most 100,000.
        images_per_class: drawings of each character.
        image_size: side of the square, one-channel images, in pixels (geometry scales with it).
        seed: chooses the whole family of characters; the same seed gives the same pixels everywhere.
        cache: keep every drawn image (``len * image_size**2`` bytes at most: 15.7 MB for the default
            train split at 28 px).

    Raises:
        ValueError: an unknown split, or a size out of range.

    Example:
        >>> glyphs = SyntheticGlyphs("val", num_classes=5, images_per_class=4)
        >>> len(glyphs), glyphs.num_classes, glyphs.image_shape, glyphs.class_names[0]
        (20, 5, (1, 28, 28), 'glyph-100000')
        >>> glyphs.gather(torch.tensor([0, 19])).shape
        torch.Size([2, 1, 28, 28])
    """

    def __init__(
        self,
        split: str = "train",
        num_classes: int | None = None,
        images_per_class: int = 20,
        image_size: int = 28,
        seed: int = 0,
        cache: bool = True,
    ):
        if split not in SPLIT_CLASS_OFFSETS:
            raise ValueError(f"split must be one of {sorted(SPLIT_CLASS_OFFSETS)}, got {split!r}")
        if num_classes is None:
            num_classes = DEFAULT_NUM_CLASSES[split]
        if not 1 <= num_classes <= CLASS_ID_STRIDE:
            raise ValueError(
                f"num_classes must be in [1, {CLASS_ID_STRIDE}] (the splits' class ids must not overlap), "
                f"got {num_classes} for split {split!r}"
            )
        if images_per_class < 1:
            raise ValueError(f"images_per_class must be >= 1, got {images_per_class}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8 pixels for strokes to be legible, got {image_size}")
        self.split = split
        self.images_per_class = images_per_class
        self.image_size = image_size
        self.seed = seed
        self.first_class_id = SPLIT_CLASS_OFFSETS[split]
        self.labels = torch.arange(num_classes).repeat_interleave(images_per_class)
        self.class_names = [f"glyph-{self.first_class_id + c:06d}" for c in range(num_classes)]
        self.image_shape = (1, image_size, image_size)
        self.cache = cache
        self._images: Tensor | None = None
        self._drawn: Tensor | None = None

    def gather(self, indices: Tensor) -> Tensor:
        """Images at ``indices`` as float32 in [0, 1], shape (len(indices), 1, image_size, image_size).

        Raises:
            IndexError: an index outside ``[0, len(self))``.
        """
        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= len(self)):
            raise IndexError(
                f"indices must lie in [0, {len(self)}) for split {self.split!r}, "
                f"got [{int(indices.min())}, {int(indices.max())}]"
            )
        if not indices.numel():
            return torch.empty(0, *self.image_shape)
        if not self.cache:
            return self.draw(indices).float().div_(255.0)
        if self._images is None or self._drawn is None:
            self._images = torch.zeros(len(self), *self.image_shape, dtype=torch.uint8)
            self._drawn = torch.zeros(len(self), dtype=torch.bool)
        missing = indices[~self._drawn[indices]].unique()
        if missing.numel():
            self._images[missing] = self.draw(missing)
            self._drawn[missing] = True
        return self._images[indices].float().div_(255.0)

    def draw(self, indices: Tensor) -> Tensor:
        """Draw the images at ``indices`` afresh (no cache): (n, 1, H, W) uint8."""
        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        classes = self.first_class_id + indices // self.images_per_class
        drawing = indices % self.images_per_class
        controls, active = class_geometry(hashed_uniform(class_keys(self.seed, classes), _CLASS_DRAWS))
        pose = hashed_uniform(image_keys(self.seed, classes, drawing), _IMAGE_DRAWS)
        points, width = image_pose(pose, controls, self.image_size)
        return self._to_uint8(rasterise(points, active, width, self.image_size, self._max_width))

    def prototypes(self, class_ids: Tensor) -> Tensor:
        """The characters themselves, drawn without jitter or pose at mid pen width: (n, 1, H, W) uint8.

        Args:
            class_ids: (n,) class ids of this split, in ``[0, num_classes)``.
        """
        class_ids = torch.as_tensor(class_ids, dtype=torch.long).reshape(-1)
        if class_ids.numel() and (int(class_ids.min()) < 0 or int(class_ids.max()) >= self.num_classes):
            raise IndexError(f"class ids must lie in [0, {self.num_classes}), got {class_ids.tolist()}")
        classes = self.first_class_id + class_ids
        controls, active = class_geometry(hashed_uniform(class_keys(self.seed, classes), _CLASS_DRAWS))
        points = controls * self.image_size - 0.5
        width = torch.full((len(class_ids),), sum(STROKE_WIDTH_RANGE) / 2 * self.image_size / REFERENCE_SIZE)
        return self._to_uint8(rasterise(points, active, width, self.image_size, self._max_width))

    @property
    def _max_width(self) -> float:
        return STROKE_WIDTH_RANGE[1] * self.image_size / REFERENCE_SIZE

    @staticmethod
    def _to_uint8(images: Tensor) -> Tensor:
        return images.mul(255.0).round_().to(torch.uint8)[:, None]

"""SyntheticGlyphs: deterministic, split-disjoint, character-like procedural classes."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from units_lightning.data.datasets.images import FewShotImages, RotatedClasses
from units_lightning.data.datasets.synthetic import (
    MAX_STROKES,
    SyntheticGlyphs,
    bezier_basis,
    bezier_curves,
    rasterise,
)


def test_shapes_labels_and_names():
    glyphs = SyntheticGlyphs("val", num_classes=7, images_per_class=3, image_size=28)
    assert isinstance(glyphs, FewShotImages)
    assert len(glyphs) == 21 and glyphs.num_classes == 7
    assert glyphs.image_shape == (1, 28, 28) and glyphs.split == "val"
    assert glyphs.labels.dtype == torch.int64
    assert glyphs.labels.tolist() == [c for c in range(7) for _ in range(3)]
    assert glyphs.class_names[0] == "glyph-100000" and glyphs.class_names[6] == "glyph-100006"
    images = glyphs.gather(torch.arange(21))
    assert images.shape == (21, 1, 28, 28) and images.dtype == torch.float32
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0
    assert glyphs.gather(torch.tensor([], dtype=torch.long)).shape == (0, 1, 28, 28)
    image, label = glyphs[5]
    assert image.shape == (1, 28, 28) and label == 1
    assert torch.equal(image, images[5])


def test_default_split_sizes():
    assert [SyntheticGlyphs(split).num_classes for split in ("train", "val", "test")] == [1000, 200, 200]
    assert len(SyntheticGlyphs("train")) == 20_000


def test_images_look_like_strokes_on_a_blank_page():
    images = SyntheticGlyphs("train", num_classes=50, images_per_class=4).gather(torch.arange(200))
    flat = images.flatten(1)
    # Background is exactly 0 and dominates; strokes are bright; nothing is blank.
    assert (flat == 0).float().mean(dim=1).min() > 0.6
    assert flat.amax(dim=1).min() > 0.9
    assert (flat > 0.5).sum(dim=1).min() >= 15
    assert 0.03 < float(flat.mean()) < 0.2
    # Anti-aliased edges: many intermediate values (Omniglot at 28 px: 44% of lit pixels), not a binary mask
    # and not a haze of faint noise.
    lit = flat[flat > 0]
    assert 0.1 < float(((lit > 0.05) & (lit < 0.95)).float().mean()) < 0.8
    assert float((lit > 0.5).float().mean()) > 0.4


def test_same_seed_same_pixels_other_seed_other_pixels():
    indices = torch.tensor([0, 1, 19, 20, 777, 19_999])
    first = SyntheticGlyphs("train", seed=3).gather(indices)
    again = SyntheticGlyphs("train", seed=3, cache=False).gather(indices)
    other = SyntheticGlyphs("train", seed=4).gather(indices)
    assert torch.equal(first, again)
    assert all(not torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_an_image_does_not_depend_on_the_batch_or_the_cache():
    glyphs = SyntheticGlyphs("test", num_classes=30, images_per_class=5, cache=False)
    indices = torch.randperm(150, generator=torch.Generator().manual_seed(0))[:64]
    batch = glyphs.gather(indices)
    one_by_one = torch.cat([glyphs.gather(index[None]) for index in indices])
    assert torch.equal(batch, one_by_one)
    cached = SyntheticGlyphs("test", num_classes=30, images_per_class=5, cache=True)
    cached.gather(indices[:10])  # fill part of the cache, then ask for a mix of cached and new images
    assert torch.equal(cached.gather(indices), batch)
    assert torch.equal(cached.gather(indices.flip(0)), batch.flip(0))


def test_cache_draws_each_image_once(monkeypatch):
    glyphs = SyntheticGlyphs("val", num_classes=5, images_per_class=4)
    first = glyphs.gather(torch.tensor([0, 3, 7]))
    drawn: list[list[int]] = []
    original = SyntheticGlyphs.draw

    def counting_draw(self, indices):
        drawn.append(sorted(indices.tolist()))
        return original(self, indices)

    monkeypatch.setattr(SyntheticGlyphs, "draw", counting_draw)
    again = glyphs.gather(torch.tensor([7, 0, 3, 3, 12]))
    assert drawn == [[12]]  # only the image not seen before, once
    assert torch.equal(again[:3], first[[2, 0, 1]])
    glyphs.gather(torch.tensor([12, 0]))
    assert drawn == [[12]]


def test_num_classes_does_not_change_a_class():
    small = SyntheticGlyphs("train", num_classes=10, images_per_class=4)
    large = SyntheticGlyphs("train", num_classes=1000, images_per_class=4)
    indices = torch.arange(40)
    assert torch.equal(small.gather(indices), large.gather(indices))


def test_splits_share_no_character():
    prototypes = {}
    for split in ("train", "val", "test"):
        glyphs = SyntheticGlyphs(split)
        prototypes[split] = glyphs.prototypes(torch.arange(glyphs.num_classes)).flatten(1).float()
    names = {split: set(SyntheticGlyphs(split).class_names) for split in ("train", "val", "test")}
    for first, second in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not names[first] & names[second]
        distances = torch.cdist(prototypes[first], prototypes[second])
        assert float(distances.min()) > 0, f"a {first} character is identical to a {second} character"
    # And the characters of one split are distinct from each other.
    within = torch.cdist(prototypes["train"], prototypes["train"])
    within.fill_diagonal_(float("inf"))
    assert float(within.min()) > 0


def test_a_class_is_closer_to_itself_than_to_others():
    num_classes, per_class = 20, 20
    glyphs = SyntheticGlyphs("train", num_classes=num_classes, images_per_class=per_class, seed=1)
    flat = glyphs.gather(torch.arange(len(glyphs))).flatten(1)
    distances = torch.cdist(flat, flat)
    same = glyphs.labels[:, None] == glyphs.labels[None, :]
    not_self = ~torch.eye(len(glyphs), dtype=torch.bool)
    within = distances[same & not_self].mean()
    between = distances[~same].mean()
    assert within < 0.95 * between, f"within-class {within:.2f} vs between-class {between:.2f}"
    # Stronger: nearest-neighbour classification (leave one out) is far above chance (5%).
    distances.fill_diagonal_(float("inf"))
    accuracy = (glyphs.labels[distances.argmin(dim=1)] == glyphs.labels).float().mean()
    assert accuracy > 0.7, f"1-NN accuracy {accuracy:.2f}"
    # But drawings of one class do vary (jitter, pen, pose): no two are identical.
    assert float(distances[same & not_self].min()) > 0


def test_geometry_scales_with_image_size():
    small = SyntheticGlyphs("train", num_classes=20, images_per_class=2, image_size=28)
    large = SyntheticGlyphs("train", num_classes=20, images_per_class=2, image_size=84)
    small_images = small.gather(torch.arange(40))
    large_images = large.gather(torch.arange(40))
    assert large_images.shape == (40, 1, 84, 84)
    # The same drawing at three times the resolution covers the same fraction of the canvas.
    assert math.isclose(float(small_images.mean()), float(large_images.mean()), rel_tol=0.15)
    downsampled = torch.nn.functional.avg_pool2d(large_images, 3)
    assert float((downsampled - small_images).abs().mean()) < 0.05


def test_rotated_classes_wrap_synthetic_glyphs():
    rotated = RotatedClasses(SyntheticGlyphs("train", num_classes=3, images_per_class=2))
    assert rotated.num_classes == 12 and len(rotated) == 24
    images = rotated.gather(torch.tensor([0, 1]))  # image 0 at 0 and 90 degrees
    assert torch.equal(images[1], torch.rot90(images[0], 1, dims=(-2, -1)))


def test_rasteriser_matches_a_dense_distance_field():
    generator = torch.Generator().manual_seed(0)
    batch, size = 6, 20
    points = torch.rand(batch, MAX_STROKES, 4, 2, generator=generator, dtype=torch.float64) * 24 - 2
    active = torch.rand(batch, MAX_STROKES, generator=generator) < 0.7
    active[:, 0] = True
    width = 0.8 + 2 * torch.rand(batch, generator=generator, dtype=torch.float64)
    drawn = rasterise(points, active, width, size, max_width=2.8)

    # Reference: every pixel against every curve sample, no windows.
    from units_lightning.data.datasets.synthetic import SAMPLES_PER_PIXEL

    basis = bezier_basis(max(8, math.ceil(SAMPLES_PER_PIXEL * size))).to(torch.float32)
    curves = bezier_curves(basis, points.to(torch.float32))  # (B, S, T, 2)
    grid_y, grid_x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    pixels = torch.stack([grid_x, grid_y], dim=-1).reshape(-1, 2).float()
    for b in range(batch):
        samples = curves[b][active[b]].reshape(-1, 2)
        nearest = (pixels[:, None] - samples[None]).norm(dim=-1).min(dim=1).values.reshape(size, size)
        expected = (width[b].float() / 2 + 0.5 - nearest).clamp(0, 1)
        torch.testing.assert_close(drawn[b], expected, atol=1e-5, rtol=0)


def test_picklable_for_dataloader_workers():
    glyphs = SyntheticGlyphs("val", num_classes=4, images_per_class=2)
    before = glyphs.gather(torch.arange(8))
    restored = pickle.loads(pickle.dumps(glyphs))
    assert torch.equal(restored.gather(torch.arange(8)), before)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "validation"}, "split must be one of"),
        ({"num_classes": 0}, "num_classes must be in"),
        ({"num_classes": 100_001}, "num_classes must be in"),
        ({"images_per_class": 0}, "images_per_class must be >= 1"),
        ({"image_size": 4}, "image_size must be >= 8"),
    ],
    ids=["unknown-split", "no-classes", "overlapping-ids", "no-images", "tiny-images"],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SyntheticGlyphs(**kwargs)


def test_out_of_range_indices():
    glyphs = SyntheticGlyphs("val", num_classes=2, images_per_class=2)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        glyphs.gather(torch.tensor([0, 4]))
    with pytest.raises(IndexError):
        glyphs.gather(torch.tensor([-1]))
    with pytest.raises(IndexError, match=r"\[0, 2\)"):
        glyphs.prototypes(torch.tensor([2]))

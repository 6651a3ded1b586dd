"""The shift probes keep every shifted query with its own label, through the whole ``test`` path.

Three checks, smallest first:

- ``ShiftProbes.queries`` shifts each image in place: images whose brightest pixel encodes their (task, query)
  position keep that code at the same position after every rotation and scale;
- a model whose prediction is a rotation-invariant function of the image (the brightness of a class's uniform
  disk, read off the brightest pixel) scores exactly its clean accuracy (100%) on every rotated query set of
  ``trainer.test``, with both engines, while a probe that reorders the queries of a set (the control) does not;
- with the real ConvNet (transductive batch norm), each level's per-query vacuity and accuracy equal those of the
  shifted query set predicted by hand from the same batch with the clean labels, and an unchanged "shift" that
  takes the shifted path reproduces the clean predictions exactly.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tiny_setup import tiny_model, tiny_trainer
from torch import nn
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from units_lightning.belief import vacuity
from units_lightning.callbacks import ResultsWriter
from units_lightning.data import EpisodicDataModule, TensorImages
from units_lightning.data.datasets.synthetic import SyntheticGlyphs
from units_lightning.evaluation import QueryShift, Rotation, Scale
from units_lightning.evaluation.probes import ShiftProbes
from units_lightning.samplers import RandomSampler

SIZE = 20
CLASSES = 10
LEVELS = [round(255 * (c + 1) / (CLASSES + 1)) / 255 for c in range(CLASSES)]  # exact uint8 brightness per class


def disk(radius: float, value: float, size: int = SIZE) -> torch.Tensor:
    """(1, size, size) uniform disk of ``value`` about the centre: bilinear rotation leaves its inside unchanged."""
    coords = torch.arange(size) - (size - 1) / 2
    inside = coords[None, :] ** 2 + coords[:, None] ** 2 <= radius**2
    return (inside * value)[None].float()


def disk_classes(images_per_class: int = 6) -> TensorImages:
    """Class c: disks of brightness ``LEVELS[c]`` and radius 4 to 6 (within-class variation)."""
    images = torch.stack([disk(4 + (i % 3), LEVELS[c]) for c in range(CLASSES) for i in range(images_per_class)])
    labels = torch.arange(CLASSES).repeat_interleave(images_per_class)
    uint8 = images.mul(255).round().to(torch.uint8)
    return TensorImages(uint8, labels, [f"level-{c}" for c in range(CLASSES)], split="test")


class BrightestPixel(nn.Module):
    """Logits from the brightest pixel only, through radial features on the class levels: a rotation-invariant
    model. Zero-initialised, so one inner step on the support set maps each level to its support label."""

    def __init__(self, n_way: int = 5):
        super().__init__()
        self.register_buffer("levels", torch.tensor(LEVELS))
        self.classifier = nn.Linear(CLASSES, n_way)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        brightest = x.flatten(1).amax(dim=1)
        return self.classifier(torch.exp(-(((brightest[:, None] - self.levels) / 0.02) ** 2)))


class ShuffledRotation(Rotation):
    """The control: rotates, then moves every query one place along its set (a probe that loses the labels)."""

    def shift(self, query_x, level, generator):
        return super().shift(query_x, level, generator).roll(1, dims=1)

    def name(self, level):
        return f"shuffled_{level:g}"


class Unchanged(QueryShift):
    """A "shift" that returns the queries as they are, but through the shifted path (not an identity level)."""

    kind = "unchanged"

    def __init__(self):
        super().__init__([1])

    def shift(self, query_x, level, generator):
        return query_x.clone()


class Recorder(Callback):
    """Keeps each test batch's outputs and the logits of its query set rotated by 90 degrees, predicted by hand."""

    def __init__(self):
        self.records = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        rotated = torch.rot90(batch.query_x[:, 0], 1, dims=(-2, -1))
        by_hand = pl_module.adapt_and_predict(batch.support_x, batch.support_y, rotated)
        self.records.append((outputs, by_hand))


def _test(tmp_path, model, data, *callbacks):
    trainer = tiny_trainer(tmp_path, callbacks=[ResultsWriter(output_dir=str(tmp_path), verbose=False), *callbacks])
    trainer.test(model, datamodule=data)
    return {row["name"]: row for rows in model.test_results["ood"].values() for row in rows}


def test_each_shifted_query_stays_in_its_place():
    """Image (t, m) is a disk whose brightness encodes t and m; every shift keeps that code at (t, m)."""
    tasks, queries = 3, 7
    codes = torch.arange(1, tasks * queries + 1).reshape(tasks, queries) / (tasks * queries + 1)
    clean = torch.stack([torch.stack([disk(5, float(v)) for v in row]) for row in codes])  # (T, M, 1, H, W)
    probes = ShiftProbes([Rotation([0, 30, 60, 90, 120, 180, 270, -90, 360]), Scale([0.75, 1.0, 1.5])])
    shifted = probes.queries(clean, seed=0, batch_idx=0)
    assert len(shifted) == 9  # 0, 360 and 1.0 are identities, predicted from the clean logits
    for level_queries in shifted:
        assert level_queries.shape == clean.shape
        assert torch.allclose(level_queries.flatten(2).amax(-1), codes, atol=1e-6)
    # The exact quarter turns rotate the same way as the interpolated angles (counter-clockwise).
    glyph = SyntheticGlyphs("test", num_classes=1, images_per_class=1).gather(torch.tensor([0]))
    interpolated = TF.rotate(glyph, 90.0, interpolation=InterpolationMode.BILINEAR)
    assert torch.allclose(Rotation().shift(glyph[None], 90, torch.Generator())[0], interpolated, atol=1e-5)


@pytest.mark.parametrize("engine", ["batched", "learn2learn"])
def test_a_rotation_invariant_model_keeps_its_clean_accuracy_on_every_rotation(tmp_path, engine):
    data = EpisodicDataModule(
        RandomSampler(tasks=1), eval_query_shots=3, test_tasks=6, eval_batch_tasks=3, splits={"test": disk_classes()}
    )
    angles = [0, 30, 45, 60, 90, 120, 150, 180, 270, 360]
    model = tiny_model(
        image_shape=(1, SIZE, SIZE),
        backbone=BrightestPixel(),
        engine=engine,
        inner_lr=5.0,
        query_shifts=[Rotation(angles), Scale([0.75, 1.5]), ShuffledRotation([60, 90]), Unchanged()],
    )
    rows = _test(tmp_path, model, data)
    assert model.test_results["accuracy"]["mean"] == 1.0
    for angle in angles:
        assert rows[f"rotation_{angle}"]["accuracy"]["mean"] == 1.0, angle
        assert rows[f"rotation_{angle}"]["vacuity"]["mean"] == pytest.approx(model.test_results["vacuity"]["mean"])
    assert rows["scale_0.75"]["accuracy"]["mean"] == rows["scale_1.5"]["accuracy"]["mean"] == 1.0
    assert rows["unchanged_1"]["accuracy"]["mean"] == 1.0
    # The control: the same rotations with the queries moved one place lose their labels, and the test sees it.
    for level in (60, 90):
        assert rows[f"shuffled_{level}"]["accuracy"]["mean"] < 0.5


@pytest.mark.parametrize("engine", ["batched", "learn2learn"])
def test_the_probe_predicts_shifted_sets_as_by_hand_with_the_clean_labels(tmp_path, engine):
    """The real ConvNet, untrained: predictions vary from query to query, so a misplaced label would show."""
    from tiny_setup import tiny_data

    torch.manual_seed(0)
    data = tiny_data(RandomSampler(tasks=1), eval_query_shots=3, test_tasks=6, eval_batch_tasks=3)
    model = tiny_model(engine=engine, filters=8, query_shifts=[Rotation([0, 90]), Unchanged()])
    recorder = Recorder()
    rows = _test(tmp_path, model, data, recorder)
    correct = []
    for outputs, by_hand in recorder.records:
        # Each shifted set is predicted on its own (batch norm uses its statistics), with the clean labels.
        assert torch.allclose(outputs["shifted"]["rotation_90"], vacuity(model.loss.evidence(by_hand)), atol=1e-6)
        assert torch.equal(outputs["shifted"]["unchanged_1"], outputs["vacuity"])
        correct.append(by_hand.argmax(-1) == outputs["labels"])
    expected = torch.cat(correct).float().mean(dim=1).mean()  # the mean over tasks of each task's accuracy
    assert rows["rotation_90"]["accuracy"]["mean"] == pytest.approx(float(expected))
    assert rows["unchanged_1"]["accuracy"]["mean"] == pytest.approx(model.test_results["accuracy"]["mean"])
    assert rows["rotation_0"]["vacuity"]["mean"] == pytest.approx(model.test_results["vacuity"]["mean"])

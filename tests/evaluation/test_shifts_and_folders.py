"""Query shifts (rotation, scale, foreign queries) and the prediction folders' error messages."""

import pytest
import torch
from PIL import Image

from units_lightning.data import FolderPredictionDataModule, TensorImages
from units_lightning.evaluation import ForeignQueries, Rotation, Scale, match_image_shape


def test_rotation_by_quarter_turns_is_exact_and_other_angles_keep_ink():
    query = torch.zeros(1, 2, 1, 9, 9)
    query[..., 1:4, 4] = 1.0  # a vertical bar above the centre
    generator = torch.Generator()
    shifted = Rotation().shift(query, 90, generator)
    assert torch.equal(shifted, torch.rot90(query, 1, dims=(-2, -1)))
    assert torch.equal(Rotation().shift(query, 180, generator), torch.flip(query, dims=(-2, -1)))
    assert float(Rotation().shift(query, 30, generator).sum()) == pytest.approx(float(query.sum()), rel=0.2)
    assert Rotation().is_identity(0) and not Rotation().is_identity(30)
    assert Rotation().name(30.0) == "rotation_30" and Scale().name(0.5) == "scale_0.5"


def test_scale_shrinks_and_enlarges_the_ink():
    query = torch.zeros(1, 1, 1, 16, 16)
    query[..., 4:12, 4:12] = 1.0
    generator = torch.Generator()
    assert float(Scale().shift(query, 0.5, generator).sum()) == pytest.approx(64 / 4, rel=0.1)
    assert float(Scale().shift(query, 1.5, generator).sum()) == pytest.approx(64 * 2.25, rel=0.1)
    with pytest.raises(ValueError):
        Scale([0.0])


def test_foreign_queries_are_seeded_and_converted_to_the_model_shape():
    images = torch.randint(0, 256, (30, 3, 32, 32), dtype=torch.uint8)
    foreign = ForeignQueries(["signs"], images={"signs": TensorImages(images, torch.arange(30) % 3, ["a", "b", "c"])})
    query = torch.zeros(2, 5, 1, 28, 28)
    first = foreign.shift(query, "signs", torch.Generator().manual_seed(0))
    again = foreign.shift(query, "signs", torch.Generator().manual_seed(0))
    assert first.shape == query.shape and torch.equal(first, again) and float(first.std()) > 0
    assert not foreign.keeps_labels and foreign.name("signs") == "signs"
    with pytest.raises(ValueError, match="root"):
        ForeignQueries(["mnist"])
    assert match_image_shape(torch.rand(2, 1, 8, 8), (3, 4, 4)).shape == (2, 3, 4, 4)


def _png(path, value=128, mode="L"):
    Image.new(mode, (20, 20), value if mode == "L" else (value, 0, 0)).save(path)


def test_prediction_folders_load_and_explain_mistakes(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / "support" / name).mkdir(parents=True)
        _png(tmp_path / "support" / name / "1.png", mode="RGB")
    (tmp_path / "query").mkdir()
    for i in range(3):
        _png(tmp_path / "query" / f"{i}.png", mode="RGB")
    data = FolderPredictionDataModule(
        str(tmp_path / "support"), str(tmp_path / "query"), image_size=8, query_set_size=2
    )
    assert data.n_way == 2 and data.image_shape == (3, 8, 8) and data.class_names == ["cat", "dog"]
    batches = list(data.predict_dataloader())
    assert [b.query_x.shape[2] for b in batches] == [2, 1] and batches[0].support_x.shape == (1, 2, 3, 8, 8)

    (tmp_path / "query" / "2.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="2.png"):
        FolderPredictionDataModule(str(tmp_path / "support"), str(tmp_path / "query")).setup("predict")
    (tmp_path / "support" / "bird").mkdir()
    with pytest.raises(ValueError, match=r"without images.*\['bird'\]"):
        FolderPredictionDataModule(str(tmp_path / "support"), str(tmp_path / "query"))
    with pytest.raises(ValueError, match="does not exist"):
        FolderPredictionDataModule(str(tmp_path / "nope"), str(tmp_path / "query"))

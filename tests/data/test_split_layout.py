"""The split-folder reader: folders and zips of ``<split>/<class>/<image>``, the decoded cache, and bad input."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

import pytest
import torch
from image_fakes import image_array, write_image, write_split_layout, zip_tree
from PIL import Image

from units_lightning.data.datasets import class_images
from units_lightning.data.datasets.class_images import Decoding
from units_lightning.data.datasets.split_layout import find_split_sources, load_split_layout

CLASSES = {"train": ["cat", "ant", "bee"], "val": ["dog", "eel"], "test": ["fox", "gnu"]}
# Index of each class in write_split_layout's colour scheme.
COLOUR_INDEX = {name: i for i, name in enumerate(n for names in CLASSES.values() for n in names)}


@pytest.fixture
def folder_root(tmp_path) -> Path:
    return write_split_layout(tmp_path / "folders", CLASSES)


@pytest.fixture
def zip_root(folder_root, tmp_path) -> Path:
    """The same data as zips, the train split cut into two parts by class as CIFAR-FS ships it."""
    root = tmp_path / "zips"
    root.mkdir()
    zip_tree(folder_root / "train", root / "train-a.zip", folder_root, only=["ant", "bee"])
    zip_tree(folder_root / "train", root / "train-b.zip", folder_root, only=["cat"])
    zip_tree(folder_root / "val", root / "val.zip", folder_root)
    zip_tree(folder_root / "test", root / "test.zip", folder_root)
    return root


def load(root: Path, split: str, cache: Path, shape=(3, 8, 8)):
    return load_split_layout(root, split, Decoding(shape, cache_dir=cache, name="fake"))


@pytest.mark.parametrize("layout", ["folders", "zips"], ids=["folders", "zips"])
def test_classes_sorted_and_pixels_from_the_right_files(layout, folder_root, zip_root, tmp_path):
    root = folder_root if layout == "folders" else zip_root
    train = load(root, "train", tmp_path / "cache")
    assert train.class_names == ["ant", "bee", "cat"]
    assert train.images.shape == (12, 3, 8, 8) and train.images.dtype == torch.uint8
    assert train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    for position in range(12):
        name, n = train.class_names[position // 4], position % 4
        assert train.images[position, :, 3, 3].tolist() == image_array(COLOUR_INDEX[name], n).tolist()
    assert load(root, "test", tmp_path / "cache").class_names == ["fox", "gnu"]


def test_zips_are_read_in_place_and_both_train_parts_count(zip_root, tmp_path):
    assert [s.path.name for s in find_split_sources(zip_root, "train")] == ["train-a.zip", "train-b.zip"]
    load(zip_root, "train", tmp_path / "cache")
    assert sorted(p.name for p in zip_root.iterdir()) == ["test.zip", "train-a.zip", "train-b.zip", "val.zip"]


def test_grey_conversion_and_resizing(folder_root, tmp_path):
    grey = load(folder_root, "val", tmp_path / "cache", shape=(1, 5, 6))
    assert grey.images.shape == (8, 1, 5, 6)
    red, green, blue = image_array(COLOUR_INDEX["dog"], 0).tolist()
    assert int(grey.images[0, 0, 2, 2]) == round((red * 299 + green * 587 + blue * 114) / 1000)


def test_second_load_decodes_nothing(zip_root, tmp_path, monkeypatch):
    first = load(zip_root, "train", tmp_path / "cache")

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded an image although the cache is valid")

    monkeypatch.setattr(class_images, "decode_image", no_decoding)
    second = load(zip_root, "train", tmp_path / "cache")
    assert torch.equal(first.images, second.images) and first.class_names == second.class_names
    with pytest.raises(AssertionError, match="decoded an image"):  # another shape is another cache entry
        load(zip_root, "train", tmp_path / "cache", shape=(3, 4, 4))


def test_changed_zip_invalidates_the_cache(zip_root, folder_root, tmp_path):
    before = load(zip_root, "val", tmp_path / "cache")
    write_image(folder_root / "val" / "dog" / "0.png", 11, 0)
    zip_tree(folder_root / "val", zip_root / "val.zip", folder_root)
    after = load(zip_root, "val", tmp_path / "cache")
    assert after.images[0, :, 0, 0].tolist() == image_array(11, 0).tolist()
    assert not torch.equal(before.images[0], after.images[0]) and torch.equal(before.images[1:], after.images[1:])


def test_corrupt_image_in_a_zip_names_zip_and_member(folder_root, tmp_path):
    (folder_root / "val" / "eel" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"broken" * 10)
    root = tmp_path / "zips"
    root.mkdir()
    zip_tree(folder_root / "val", root / "val.zip", folder_root)
    with pytest.raises(ValueError, match="corrupt") as error:
        load(root, "val", tmp_path / "cache")
    assert f"{root / 'val.zip'}/val/eel/2.png" in str(error.value)


def test_corrupt_image_in_a_folder_names_the_file(folder_root, tmp_path):
    bad = folder_root / "test" / "gnu" / "1.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match="corrupt") as error:
        load(folder_root, "test", tmp_path / "cache")
    assert str(bad) in str(error.value)


def good_entries() -> dict[str, bytes]:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    return {"val/cls/image.png": buffer.getvalue()}


def write_zip(path: Path, extra: dict[str, bytes] | None = None, symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in {**good_entries(), **(extra or {})}.items():
            archive.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo(symlink)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return path


@pytest.mark.parametrize(
    ("extra", "symlink", "message"),
    [
        ({"../evil.png": b"x"}, None, "escapes the extraction folder"),
        ({"val/../../evil.png": b"x"}, None, "escapes the extraction folder"),
        ({"/tmp/evil.png": b"x"}, None, "absolute path"),
        (None, "val/cls/link.png", "symbolic link"),
        ({"val/cls/bomb.png": bytes(8 * 2**20)}, None, "zip bomb"),
    ],
    ids=["traversal", "nested-traversal", "absolute", "symlink", "size-bomb"],
)
def test_malicious_zips_are_refused_before_anything_is_read(tmp_path, monkeypatch, extra, symlink, message):
    root = tmp_path / "evil"
    root.mkdir()
    write_zip(root / "val.zip", extra, symlink)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded an image of an unsafe archive")

    monkeypatch.setattr(class_images, "decode_image", no_decoding)
    with pytest.raises(ValueError, match=message) as error:
        load_split_layout(root, "val", Decoding((3, 4, 4), cache_dir=tmp_path / "cache", name="fake"))
    assert "unsafe zip" in str(error.value) and "val.zip" in str(error.value)
    assert not (tmp_path / "evil.png").exists() and not (tmp_path / "cache").exists()


def test_image_at_the_wrong_depth_is_reported(folder_root, tmp_path):
    write_image(folder_root / "val" / "stray.png", 0, 0)
    with pytest.raises(ValueError, match="not in the layout <class>/<image>"):
        load(folder_root, "val", tmp_path / "cache")


def test_missing_split_lists_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load(tmp_path / "nothing", "val", tmp_path / "cache")
    message = str(error.value)
    assert f"{tmp_path / 'nothing' / 'val'}/" in message and "validation" in message and "val*.zip" in message


def test_validation_alias_and_unrelated_zips(folder_root, tmp_path):
    root = tmp_path / "aliased"
    (root).mkdir()
    (folder_root / "val").rename(root / "validation")
    write_zip(root / "values.zip")  # "values" is not "val": ignored
    assert [s.path.name for s in find_split_sources(root, "val")] == ["validation"]
    assert load(root, "val", tmp_path / "cache").class_names == ["dog", "eel"]


@pytest.mark.parametrize("shape", [(2, 8, 8), (3, 0, 8), (3, 8)], ids=["two-channels", "zero-side", "two-numbers"])
def test_decoding_refuses_a_shape_it_cannot_produce(shape):
    with pytest.raises(ValueError, match="image_shape must be"):
        Decoding(shape)


def test_decoding_names_its_cache_file_by_dataset_and_shape(tmp_path):
    decoding = Decoding([3, 8, 6], cache_dir=tmp_path, name="fake")
    assert decoding.image_shape == (3, 8, 6)
    assert decoding.cache_path("0123456789abcdef-rest") == tmp_path / "fake-3x8x6-0123456789abcdef.pt"

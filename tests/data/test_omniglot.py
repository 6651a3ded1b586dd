"""Omniglot loading (folder, zip and torchvision layouts, cache, errors) and the few-shot splits.

Most tests run on a tiny fake Omniglot written to tmp_path; the tests marked ``data`` read the real
release from ../shared/data/omniglot (or $UNITS_LIGHTNING_SHARED_DATA/omniglot) and are skipped without it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from units_lightning.data.datasets import omniglot as omniglot_module
from units_lightning.data.datasets.images import RotatedClasses, TensorImages
from units_lightning.data.datasets.omniglot import load_omniglot, omniglot_splits

# The fake release: alphabets deliberately created out of order, to check sorting; evaluation alphabets
# come after background ones even where their names sort earlier.
FAKE_LAYOUT = {
    "images_background": {"Zeta_script": ["character02", "character01"], "Alpha_script": ["character01"]},
    "images_evaluation": {"Beta_script": ["character01", "character03"]},
}
FAKE_ORDER = [
    "Alpha_script/character01",
    "Zeta_script/character01",
    "Zeta_script/character02",
    "Beta_script/character01",
    "Beta_script/character03",
]
DRAWINGS = 3
SIZE = 105


def shared_data_dir() -> Path:
    configured = os.environ.get("UNITS_LIGHTNING_SHARED_DATA")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def fake_drawing(character: int, drawing: int) -> Image.Image:
    """A 105x105 one-bit drawing, black strokes on white like Omniglot, unique to (character, drawing)."""
    image = Image.new("1", (SIZE, SIZE), 1)
    pen = ImageDraw.Draw(image)
    top = 10 + 12 * character
    pen.line([(10, top), (90, top + 5 * drawing)], fill=0, width=6)
    pen.ellipse([20 + 15 * drawing, 60, 40 + 15 * drawing, 80], outline=0, width=5)
    return image


def expected_drawing(character: int, drawing: int) -> np.ndarray:
    return 255 - np.asarray(fake_drawing(character, drawing).convert("L"))


def write_fake_omniglot(base: Path) -> Path:
    """``base/images_background/<alphabet>/<character>/<id>_<nn>.png`` and ``images_evaluation``."""
    for set_name, alphabets in FAKE_LAYOUT.items():
        for alphabet, characters in alphabets.items():
            for character in characters:
                index = FAKE_ORDER.index(f"{alphabet}/{character}")
                folder = base / set_name / alphabet / character
                folder.mkdir(parents=True)
                # Written in reverse so that file-system order is not sorted order.
                for drawing in reversed(range(DRAWINGS)):
                    fake_drawing(index, drawing).save(folder / f"{index:04d}_{drawing + 1:02d}.png")
    return base


def zip_folder(folder: Path, zip_path: Path) -> Path:
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            archive.write(path, path.relative_to(folder.parent).as_posix())
    return zip_path


@pytest.fixture
def fake_folder(tmp_path) -> Path:
    return write_fake_omniglot(tmp_path / "omniglot")


@pytest.fixture
def fake_zips(tmp_path) -> Path:
    unpacked = write_fake_omniglot(tmp_path / "unpacked")
    root = tmp_path / "zips"
    root.mkdir()
    for set_name in FAKE_LAYOUT:
        zip_folder(unpacked / set_name, root / f"{set_name}.zip")
    return root


def load(root: Path, cache: Path, **kwargs):
    return load_omniglot(root, cache_dir=cache, **kwargs)


# ---------------------------------------------------------------- fake data: layouts and ordering


def test_folder_layout_order_and_pixels(fake_folder, tmp_path):
    images, names = load(fake_folder, tmp_path / "cache", image_size=SIZE)
    assert names == FAKE_ORDER
    assert images.shape == (5, DRAWINGS, 1, SIZE, SIZE) and images.dtype == torch.uint8
    for character in range(5):
        for drawing in range(DRAWINGS):
            np.testing.assert_array_equal(images[character, drawing, 0].numpy(), expected_drawing(character, drawing))


def test_zip_and_torchvision_layouts_match_the_folder(fake_folder, fake_zips, tmp_path):
    from_folder = load(fake_folder, tmp_path / "cache-folder", image_size=SIZE)
    from_zips = load(fake_zips, tmp_path / "cache-zips", image_size=SIZE)
    torchvision_root = tmp_path / "tv"
    shutil.copytree(fake_folder, torchvision_root / "omniglot-py")
    from_torchvision = load(torchvision_root, tmp_path / "cache-tv", image_size=SIZE)
    for images, names in (from_zips, from_torchvision):
        assert names == from_folder[1]
        assert torch.equal(images, from_folder[0])
    # Zips are read in place: nothing is extracted next to them or into the cache.
    assert sorted(p.name for p in fake_zips.iterdir()) == ["images_background.zip", "images_evaluation.zip"]
    assert [p.suffix for p in (tmp_path / "cache-zips").iterdir()] == [".pt"]


def test_torchvision_zips_without_extraction(fake_zips, tmp_path):
    root = tmp_path / "tv"
    shutil.copytree(fake_zips, root / "omniglot-py")
    images, names = load(root, tmp_path / "cache", image_size=SIZE)
    assert names == FAKE_ORDER and images.shape[:2] == (5, DRAWINGS)


def test_resized_images_have_bright_strokes_on_black(fake_folder, tmp_path):
    images, _ = load(fake_folder, tmp_path / "cache", image_size=28)
    assert images.shape == (5, DRAWINGS, 1, 28, 28)
    pixels = images.float() / 255
    assert float(pixels.mean()) < 0.5
    assert int(images.max()) == 255
    # Corners of the canvas are background in every drawing.
    assert int(images[..., 0, 0].max()) == 0 and int(images[..., -1, -1].max()) == 0


def test_hidden_files_and_non_png_are_ignored(fake_folder, tmp_path):
    (fake_folder / "images_background" / ".DS_Store").write_bytes(b"junk")
    (fake_folder / "images_background" / "Alpha_script" / "character01" / "notes.txt").write_text("x")
    (fake_folder / "images_background" / ".hidden_alphabet" / "character01").mkdir(parents=True)
    _, names = load(fake_folder, tmp_path / "cache", image_size=28)
    assert names == FAKE_ORDER


# ---------------------------------------------------------------- cache


def test_second_load_reads_the_cache(fake_folder, tmp_path, monkeypatch):
    first = load(fake_folder, tmp_path / "cache", image_size=28)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again although the cache is valid")

    monkeypatch.setattr(omniglot_module, "decode_drawing", no_decoding)
    second = load(fake_folder, tmp_path / "cache", image_size=28)
    assert torch.equal(first[0], second[0]) and first[1] == second[1]
    # Another image size is another cache entry.
    with pytest.raises(AssertionError, match="decoded again"):
        load(fake_folder, tmp_path / "cache", image_size=14)


@pytest.mark.parametrize("layout", ["folder", "zip"], ids=["folder", "zip"])
def test_changed_source_invalidates_the_cache(layout, fake_folder, fake_zips, tmp_path):
    root = fake_folder if layout == "folder" else fake_zips
    before, _ = load(root, tmp_path / "cache", image_size=SIZE)
    # Replace one drawing (Alpha_script/character01, drawing 1) by a blank page.
    blank = Image.new("1", (SIZE, SIZE), 1)
    if layout == "folder":
        blank.save(fake_folder / "images_background" / "Alpha_script" / "character01" / "0000_01.png")
    else:
        unpacked = tmp_path / "unpacked"
        blank.save(unpacked / "images_background" / "Alpha_script" / "character01" / "0000_01.png")
        zip_folder(unpacked / "images_background", fake_zips / "images_background.zip")
    after, _ = load(root, tmp_path / "cache", image_size=SIZE)
    assert int(after[0, 0].max()) == 0 and int(before[0, 0].max()) == 255
    assert torch.equal(after[1:], before[1:])


def test_unreadable_cache_is_rebuilt(fake_folder, tmp_path):
    images, _ = load(fake_folder, tmp_path / "cache", image_size=28)
    (cache_file,) = (tmp_path / "cache").glob("*.pt")
    cache_file.write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="unreadable Omniglot cache"):
        again, _ = load(fake_folder, tmp_path / "cache", image_size=28)
    assert torch.equal(images, again)


def test_default_cache_dir_comes_from_the_environment(fake_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("UNITS_LIGHTNING_CACHE", str(tmp_path / "env-cache"))
    load_omniglot(fake_folder, image_size=28)
    assert len(list((tmp_path / "env-cache" / "omniglot").glob("omniglot-28px-*.pt"))) == 1


# ---------------------------------------------------------------- errors


def test_corrupt_png_in_a_folder_is_named(fake_folder, tmp_path):
    bad = fake_folder / "images_evaluation" / "Beta_script" / "character03" / "0004_02.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
    with pytest.raises(ValueError, match="corrupt") as error:
        load(fake_folder, tmp_path / "cache", image_size=28)
    assert str(bad) in str(error.value)
    assert "Re-download" in str(error.value)


def test_truncated_png_in_a_zip_is_named(tmp_path):
    unpacked = write_fake_omniglot(tmp_path / "unpacked")
    bad = unpacked / "images_background" / "Zeta_script" / "character02" / "0002_03.png"
    bad.write_bytes(bad.read_bytes()[:60])
    root = tmp_path / "zips"
    root.mkdir()
    for set_name in FAKE_LAYOUT:
        zip_folder(unpacked / set_name, root / f"{set_name}.zip")
    with pytest.raises(ValueError, match="corrupt") as error:
        load(root, tmp_path / "cache", image_size=28)
    assert "images_background.zip/images_background/Zeta_script/character02/0002_03.png" in str(error.value)


def test_missing_root_explains_how_to_get_the_data(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load(tmp_path / "nowhere", tmp_path / "cache")
    message = str(error.value)
    assert "download=True" in message
    assert "images_background" in message and "images_evaluation" in message
    assert str(tmp_path / "nowhere") in message


def test_half_missing_names_the_missing_half(fake_folder, tmp_path):
    shutil.rmtree(fake_folder / "images_evaluation")
    with pytest.raises(FileNotFoundError, match="missing images_evaluation \\(") as error:
        load(fake_folder, tmp_path / "cache")
    assert "missing images_background" not in str(error.value)


def test_zip_with_an_escaping_entry_is_refused(fake_zips, tmp_path):
    with zipfile.ZipFile(fake_zips / "images_evaluation.zip", "a") as archive:
        archive.writestr("../evil.png", b"not really a png")
    with pytest.raises(ValueError, match="unsafe zip") as error:
        load(fake_zips, tmp_path / "cache")
    assert "'../evil.png'" in str(error.value) and "images_evaluation.zip" in str(error.value)
    assert not (fake_zips.parent / "evil.png").exists()


def test_incomplete_character_is_reported(fake_folder, tmp_path):
    (fake_folder / "images_background" / "Zeta_script" / "character01" / "0001_02.png").unlink()
    with pytest.raises(ValueError, match="Zeta_script/character01 has 2 drawings"):
        load(fake_folder, tmp_path / "cache")


def test_empty_set_is_reported(fake_folder, tmp_path):
    shutil.rmtree(fake_folder / "images_evaluation")
    (fake_folder / "images_evaluation").mkdir()
    with pytest.raises(ValueError, match="holds no PNG images"):
        load(fake_folder, tmp_path / "cache")


# ---------------------------------------------------------------- download


def fake_torchvision(monkeypatch, calls: list, fail: bool = False) -> None:
    """Replace torchvision.datasets.Omniglot by one that 'downloads' the fake release."""

    class FakeOmniglot:
        def __init__(self, root: str, background: bool = True, download: bool = False):
            calls.append((root, background, download))
            if fail:
                raise RuntimeError("Failed to download (network unreachable)")
            set_name = "images_background" if background else "images_evaluation"
            source = write_fake_omniglot(Path(root) / "staging" / set_name)
            shutil.copytree(source / set_name, Path(root) / "omniglot-py" / set_name)

    datasets = types.SimpleNamespace(Omniglot=FakeOmniglot)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)


def test_download_fetches_only_missing_halves(fake_folder, tmp_path, monkeypatch):
    shutil.rmtree(fake_folder / "images_evaluation")
    calls: list = []
    fake_torchvision(monkeypatch, calls)
    _, names = load(fake_folder, tmp_path / "cache", download=True, image_size=28)
    assert calls == [(str(fake_folder), False, True)]
    assert names == FAKE_ORDER


def test_download_not_called_when_present(fake_folder, tmp_path, monkeypatch):
    calls: list = []
    fake_torchvision(monkeypatch, calls)
    load(fake_folder, tmp_path / "cache", download=True, image_size=28)
    assert calls == []


def test_download_failure_propagates_with_a_note(tmp_path, monkeypatch):
    calls: list = []
    fake_torchvision(monkeypatch, calls, fail=True)
    with pytest.raises(RuntimeError, match="network unreachable") as error:
        load(tmp_path / "offline", tmp_path / "cache", download=True)
    if sys.version_info >= (3, 11):
        notes = " ".join(error.value.__notes__)
        assert "brendenlake/omniglot" in notes and "offline" in notes


# ---------------------------------------------------------------- splits


def small_release(characters: int = 10, drawings: int = 4) -> tuple[torch.Tensor, list[str]]:
    images = torch.arange(characters * drawings, dtype=torch.uint8).reshape(characters, drawings, 1, 1, 1)
    images = images.expand(characters, drawings, 1, 3, 3).contiguous()
    return images, [f"alphabet/character{c:02d}" for c in range(characters)]


def test_splits_are_consecutive_characters():
    images, names = small_release()
    splits = omniglot_splits(images, names, split_sizes=(5, 2, 3), rotations=(0, 90), rotate_splits=("train",))
    assert isinstance(splits["train"], RotatedClasses)
    assert isinstance(splits["val"], TensorImages) and isinstance(splits["test"], TensorImages)
    assert [splits[s].num_classes for s in ("train", "val", "test")] == [10, 2, 3]
    assert [splits[s].split for s in ("train", "val", "test")] == ["train", "val", "test"]
    assert splits["val"].class_names == names[5:7] and splits["test"].class_names == names[7:]
    assert splits["train"].class_names[:2] == [f"{names[0]}@0", f"{names[0]}@90"]
    # Image j of class c in a split is drawing j of character (offset + c); pixel value = its flat id.
    val = splits["val"].gather(torch.arange(8)) * 255
    assert val[:, 0, 0, 0].round().tolist() == list(range(20, 28))
    assert splits["val"].labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    test = splits["test"].gather(torch.tensor([11])) * 255
    assert round(float(test[0, 0, 0, 0])) == (7 + 2) * 4 + 3


def test_splits_can_leave_characters_unused_and_rotate_several_splits():
    images, names = small_release()
    splits = omniglot_splits(images, names, split_sizes=(3, 1, 2), rotate_splits=("train", "test"))
    assert splits["train"].num_classes == 12 and splits["val"].num_classes == 1
    assert splits["test"].num_classes == 8 and splits["test"].class_names[0] == f"{names[4]}@0"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split_sizes": (6, 3, 2)}, "need 11 characters but only 10"),
        ({"split_sizes": (5, -1, 3)}, "non-negative"),
        ({"split_sizes": (5, 5)}, "three non-negative counts"),
        ({"rotate_splits": ("training",)}, "unknown \\['training'\\]"),
        ({"rotations": (45,)}, "multiples of 90"),
    ],
    ids=["too-many", "negative", "two-sizes", "unknown-split", "bad-rotation"],
)
def test_invalid_split_arguments(kwargs, message):
    images, names = small_release()
    kwargs = {"split_sizes": (5, 2, 3), **kwargs}
    with pytest.raises(ValueError, match=message):
        omniglot_splits(images, names, **kwargs)


def test_split_inputs_are_checked():
    images, names = small_release()
    with pytest.raises(ValueError, match="got 9 names for 10 characters"):
        omniglot_splits(images, names[:-1], split_sizes=(5, 2, 3))
    with pytest.raises(ValueError, match="uint8 of shape"):
        omniglot_splits(images.flatten(0, 1), names, split_sizes=(5, 2, 3))


# ---------------------------------------------------------------- the real release


@pytest.fixture(scope="module")
def real_omniglot(tmp_path_factory):
    root = shared_data_dir() / "omniglot"
    if not (root / "images_background.zip").is_file():
        pytest.skip(f"real Omniglot not found at {root} (set UNITS_LIGHTNING_SHARED_DATA to the shared data folder)")
    cache = tmp_path_factory.mktemp("omniglot-cache")
    start = time.perf_counter()
    images, names = load_omniglot(root, cache_dir=cache)
    first_seconds = time.perf_counter() - start
    print(f"\nOmniglot first load (decode 32,460 PNGs): {first_seconds:.2f} s")
    return root, cache, images, names


@pytest.mark.data
def test_real_release_shape_and_order(real_omniglot):
    _, _, images, names = real_omniglot
    assert images.shape == (1623, 20, 1, 28, 28) and images.dtype == torch.uint8
    assert len(names) == len(set(names)) == 1623
    alphabets = [name.split("/")[0] for name in names]
    assert len(set(alphabets[:964])) == 30 and len(set(alphabets[964:])) == 20
    assert not set(alphabets[:964]) & set(alphabets[964:])
    assert names[0] == "Alphabet_of_the_Magi/character01"
    assert names[963] == "Tifinagh/character55" and names[964] == "Angelic/character01"
    assert alphabets[:964] == sorted(alphabets[:964]) and alphabets[964:] == sorted(alphabets[964:])


@pytest.mark.data
def test_real_release_has_bright_strokes(real_omniglot):
    _, _, images, _ = real_omniglot
    pixels = images.float() / 255
    assert float(pixels.mean()) < 0.5
    brightest = pixels.amax(dim=(2, 3, 4))
    assert float(brightest.max()) == 1.0
    # Strokes reach full intensity in nearly every drawing (a few are dots that 28 px blurs: 95 of 32,460).
    assert float((brightest > 0.9).float().mean()) > 0.99 and float(brightest.min()) > 0.5
    assert float((pixels == 0).float().mean()) > 0.5  # the background is black
    # Drawings differ, within and across characters.
    assert not torch.equal(images[0, 0], images[0, 1]) and not torch.equal(images[0, 0], images[1, 0])


@pytest.mark.data
def test_real_release_splits(real_omniglot):
    _, _, images, names = real_omniglot
    splits = omniglot_splits(images, names)
    assert [splits[s].num_classes for s in ("train", "val", "test")] == [1150 * 4, 50, 423]
    assert [len(splits[s]) for s in ("train", "val", "test")] == [1150 * 4 * 20, 50 * 20, 423 * 20]
    assert splits["val"].class_names[0] == names[1150] and splits["test"].class_names[-1] == names[-1]
    assert splits["train"].gather(torch.tensor([0, 91_999])).shape == (2, 1, 28, 28)


@pytest.mark.data
def test_real_release_second_load_hits_the_cache(real_omniglot, monkeypatch):
    root, cache, images, names = real_omniglot

    def no_decoding(*args, **kwargs):
        raise AssertionError("the second load decoded images instead of reading the cache")

    monkeypatch.setattr(omniglot_module, "decode_characters", no_decoding)
    start = time.perf_counter()
    again, again_names = load_omniglot(root, cache_dir=cache)
    print(f"\nOmniglot second load (cache): {(time.perf_counter() - start) * 1000:.0f} ms")
    assert torch.equal(again, images) and again_names == names

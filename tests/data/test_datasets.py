"""CIFAR-FS from torchvision's CIFAR-100, mini-ImageNet's CSV and learn2learn layouts, users' own folders,
per-channel normalisation, and the errors for missing data (fake data in tmp_path; no network)."""

from __future__ import annotations

import csv
import pickle
import sys
import types

import numpy as np
import pytest
import torch
from image_fakes import write_image, write_split_layout

from units_lightning.data import CIFARFSDataModule, FewShotImageFolderDataModule, MiniImageNetDataModule, TensorImages
from units_lightning.data.datasets.cifarfs import CIFARFS_CLASSES, load_cifarfs
from units_lightning.data.datasets.image_folder import split_by_lists, split_by_ratios
from units_lightning.data.datasets.miniimagenet import IMAGENET_MEAN, IMAGENET_STD, load_miniimagenet
from units_lightning.samplers import RandomSampler

# ---------------------------------------------------------------- normalisation


def test_gather_normalises_per_channel_from_uint8():
    images = torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    split = TensorImages(images, torch.tensor([0, 0, 1, 1]), ["a", "b"], mean=mean, std=std)
    expected = (images.double() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(split.gather(torch.arange(4)).double(), expected, atol=1e-5, rtol=0)
    assert split.images.dtype == torch.uint8  # kept small; normalised only when gathered


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [
        ((0.5,), None, "both mean and std"),
        ((0.5,), (0.5,), "one value per channel"),
        ((0, 0, 0), (1, 0, 1), "positive"),
    ],
    ids=["only-mean", "wrong-length", "zero-std"],
)
def test_bad_normalisation_is_refused(mean, std, message):
    with pytest.raises(ValueError, match=message):
        TensorImages(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.tensor([0]), ["a"], mean=mean, std=std)


# ---------------------------------------------------------------- CIFAR-FS from torchvision


def fake_cifar100(monkeypatch, calls: list) -> list[str]:
    """torchvision.datasets.CIFAR100 replaced by 2 + 1 images per class whose pixels encode (label, index)."""
    names = sorted(n for split in CIFARFS_CLASSES.values() for n in split)

    class FakeCIFAR100:
        classes = names

        def __init__(self, root: str, train: bool = True, download: bool = False):
            calls.append((root, train, download))
            per_class = 2 if train else 1
            self.targets = [label for label in range(100) for _ in range(per_class)]
            self.data = np.zeros((100 * per_class, 32, 32, 3), dtype=np.uint8)
            for i, label in enumerate(self.targets):
                self.data[i, :, :, 0] = label
                self.data[i, :, :, 1] = (i % per_class) + (0 if train else 10)

    monkeypatch.setitem(sys.modules, "torchvision.datasets", types.SimpleNamespace(CIFAR100=FakeCIFAR100))
    return names


def test_cifar100_download_is_arranged_into_the_split(tmp_path, monkeypatch):
    calls: list = []
    names = fake_cifar100(monkeypatch, calls)
    val = load_cifarfs(tmp_path / "cifar", "val", download=True)
    assert calls == [(str(tmp_path / "cifar"), True, True), (str(tmp_path / "cifar"), False, True)]
    assert val.class_names == sorted(CIFARFS_CLASSES["val"]) and val.images.shape == (16 * 3, 3, 32, 32)
    labels_in_pixels = val.images[:, 0, 0, 0].tolist()
    assert labels_in_pixels == [names.index(name) for name in val.class_names for _ in range(3)]
    assert val.images[:3, 1, 0, 0].tolist() == [0, 1, 10]  # train images, then test images


def test_missing_cifarfs_names_the_paths_and_the_download_flag(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_cifarfs(tmp_path / "none", "train")
    message = str(error.value)
    assert "--data.download true" in message and f"{tmp_path / 'none' / 'train'}/" in message
    assert "cifar-100-python" in message


def test_a_folder_that_is_not_cifarfs_is_refused(tmp_path):
    root = write_split_layout(tmp_path / "other", {"train": ["x"], "val": ["y"], "test": ["z"]})
    with pytest.raises(ValueError, match="not the CIFAR-FS split"):
        load_cifarfs(root, "val", cache_dir=tmp_path / "cache")


def test_too_many_ways_for_a_split_errors_at_setup(tmp_path, monkeypatch):
    fake_cifar100(monkeypatch, [])
    data = CIFARFSDataModule(root=str(tmp_path), download=True, n_way=20, sampler=RandomSampler(tasks=1), k_shot=1)
    with pytest.raises(ValueError, match="n_way=20 but split 'val' has only 16 classes"):
        data.setup("validate")


# ---------------------------------------------------------------- mini-ImageNet


def write_csv_release(root, classes: dict[str, list[str]], per_class: int = 3) -> None:
    index = 0
    for split, wnids in classes.items():
        rows = []
        for wnid in wnids:
            for n in range(per_class):
                filename = f"{wnid}{n:08d}.jpg"
                write_image(root / "images" / filename, index, n)
                rows.append((filename, wnid))
            index += 1
        with open(root / f"{split}.csv", "w", newline="") as file:
            csv.writer(file).writerows([("filename", "label"), *rows])


MINI = {"train": ["n02", "n01"], "val": ["n03"], "test": ["n04", "n05"]}


def test_miniimagenet_csv_release(tmp_path):
    write_csv_release(tmp_path / "mini", MINI)
    train = load_miniimagenet(tmp_path / "mini", "train", cache_dir=tmp_path / "cache", image_size=8)
    assert train.class_names == ["n01", "n02"] and train.images.shape == (6, 3, 8, 8)


def test_split_folder_that_contradicts_the_csv_is_refused(tmp_path):
    root = write_split_layout(tmp_path / "mini", {"train": ["n01", "n09"], "val": ["n03"], "test": ["n04"]})
    write_csv_release(tmp_path / "csv", MINI)
    (tmp_path / "csv" / "train.csv").rename(root / "train.csv")
    with pytest.raises(ValueError, match=r"missing classes \['n02'\], unexpected \['n09'\]"):
        load_miniimagenet(root, "train", cache_dir=tmp_path / "cache", image_size=8)


def test_learn2learn_pickle_is_read_without_unpickling_code(tmp_path):
    pixels = np.arange(4 * 84 * 84 * 3, dtype=np.uint64).astype(np.uint8).reshape(4, 84, 84, 3)
    content = {"image_data": pixels, "class_dict": {"n02": [2, 3], "n01": [0, 1]}}
    (tmp_path / "mini-imagenet-cache-validation.pkl").write_bytes(pickle.dumps(content, protocol=4))
    val = load_miniimagenet(tmp_path, "val")
    assert val.class_names == ["n01", "n02"] and val.labels.tolist() == [0, 0, 1, 1]
    assert torch.equal(val.images, torch.from_numpy(pixels).permute(0, 3, 1, 2))


class Exploit:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_malicious_learn2learn_pickle_is_refused(tmp_path, capsys):
    evil = {"image_data": np.zeros((1, 84, 84, 3), dtype=np.uint8), "class_dict": {"n01": Exploit()}}
    (tmp_path / "mini-imagenet-cache-test.pkl").write_bytes(pickle.dumps(evil))
    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        load_miniimagenet(tmp_path, "test")
    assert "must never run" not in capsys.readouterr().out


def test_miniimagenet_download_fetches_the_pickle(tmp_path, monkeypatch):
    calls = []

    def fake_download(url, root, filename):
        calls.append(url)
        content = {"image_data": np.zeros((2, 84, 84, 3), dtype=np.uint8), "class_dict": {"n07": [0, 1]}}
        (tmp_path / filename).write_bytes(pickle.dumps(content))

    monkeypatch.setitem(sys.modules, "torchvision.datasets.utils", types.SimpleNamespace(download_url=fake_download))
    data = MiniImageNetDataModule(root=str(tmp_path), download=True, n_way=1, image_size=84)
    assert data.make_split("train").class_names == ["n07"]
    assert calls == ["https://zenodo.org/record/7978538/files/mini-imagenet-cache-train.pkl"]


def test_missing_miniimagenet_says_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_miniimagenet(tmp_path, "val")
    message = str(error.value)
    assert "mini-imagenet-cache-validation.pkl" in message and "train.csv" in message and "--data.download" in message


def test_cifarfs_and_miniimagenet_data_modules_keep_their_defaults_and_options():
    cifar, mini = CIFARFSDataModule(), MiniImageNetDataModule()
    assert (str(cifar.root), cifar.image_shape, cifar.mean, cifar.std) == ("data/cifarfs", (3, 32, 32), None, None)
    assert (str(mini.root), mini.image_shape) == ("data/miniimagenet", (3, 84, 84))
    assert (mini.mean, mini.std) == (IMAGENET_MEAN, IMAGENET_STD)  # the authors' normalisation
    data = CIFARFSDataModule(root="cifar", download=True, cache_dir="cache", image_size=16, mean=(0.5,) * 3, std=None)
    assert (data.download, data.cache_dir, data.image_shape, data.mean) == (True, "cache", (3, 16, 16), (0.5,) * 3)


# ---------------------------------------------------------------- users' own folders


def test_split_by_ratios_is_a_seeded_partition():
    split = split_by_ratios(10, (0.6, 0.2, 0.2), seed=3)
    assert sorted(sum(split.values(), [])) == list(range(10)) and [len(split[s]) for s in split] == [6, 2, 2]
    assert split == split_by_ratios(10, (0.6, 0.2, 0.2), seed=3) != split_by_ratios(10, (0.6, 0.2, 0.2), seed=4)
    with pytest.raises(ValueError, match="summing to 1"):
        split_by_ratios(10, (0.5, 0.2, 0.2))
    with pytest.raises(ValueError, match="too few"):
        split_by_ratios(2, (0.4, 0.3, 0.3))


def test_split_by_lists_checks_names():
    names = ["a", "b", "c"]
    assert split_by_lists(names, {"train": ["c", "a"], "val": ["b"]}) == {"train": [2, 0], "val": [1]}
    with pytest.raises(ValueError, match=r"lists classes \['d'\]"):
        split_by_lists(names, {"train": ["d"]})
    with pytest.raises(ValueError, match="'a' is in both"):
        split_by_lists(names, {"train": ["a"], "test": ["a"]})


def user_folder(tmp_path, classes: int = 6):
    for c in range(classes):
        for n in range(3):
            write_image(tmp_path / "birds" / f"species{c}" / f"{n}.jpg", c, n, size=12)
    return tmp_path / "birds"


def test_image_folder_data_module_with_lists_grey_and_rotations(tmp_path):
    root = user_folder(tmp_path)
    lists = {"train": ["species0", "species1", "species2"], "val": ["species3", "species4"], "test": ["species5"]}
    data = FewShotImageFolderDataModule(
        root=str(root), split=lists, image_size=10, channels=1, rotations=[0, 180], cache_dir=str(tmp_path / "c"),
        n_way=2, k_shot=1, sampler=RandomSampler(tasks=2), val_tasks=2, eval_batch_tasks=2,
    )  # fmt: skip
    data.setup("fit")
    assert data.image_shape == (1, 10, 10)
    assert data.split("train").num_classes == 6 and data.split("val").class_names == ["species3", "species4"]
    batch = next(iter(data.train_dataloader()))
    assert batch.support_x.shape == (2, 2, 1, 10, 10)


def test_image_folder_presplit_folders(tmp_path):
    root = write_split_layout(tmp_path / "mine", {"train": ["a", "b"], "val": ["c", "d"], "test": ["e", "f"]})
    data = FewShotImageFolderDataModule(root=str(root), split="folders", image_size=8, cache_dir=str(tmp_path / "c"))
    assert data.make_split("test").class_names == ["e", "f"]


@pytest.mark.parametrize(
    "split",
    [[0.5, 0.25, 0.25], {"train": ["species0"], "val": ["species1"]}, "folders"],
    ids=["ratios", "lists", "folders"],
)
def test_image_folder_split_parses_from_a_config(split):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(FewShotImageFolderDataModule, "data")
    parsed = parser.parse_object({"data": {"root": "birds", "split": split, "n_way": 3}})
    data = parser.instantiate_classes(parsed).data
    assert data.split_spec == (tuple(split) if isinstance(split, list) else split) and data.n_way == 3

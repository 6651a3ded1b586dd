"""The real datasets of ../shared/data (skipped without it): sizes, class splits, episodes, OOD sets.

Every set is decoded once per session into a shared temporary cache (CIFAR-FS: 60,000 PNGs).
"""

from __future__ import annotations

import pytest
import torch
from image_fakes import shared

from units_lightning.data import CIFARFSDataModule, MiniImageNetDataModule, OmniglotDataModule
from units_lightning.data.datasets.cifarfs import CIFARFS_CLASSES, load_cifarfs
from units_lightning.data.datasets.miniimagenet import IMAGENET_MEAN, IMAGENET_STD, load_miniimagenet, read_split_csv
from units_lightning.data.datasets.ood import load_ood
from units_lightning.samplers import MultiQuerySampler

SPLITS = ("train", "val", "test")


@pytest.mark.data
def test_cifarfs_has_64_16_20_classes_of_600_rgb_32px(shared_cache):
    root = shared("cifarfs")
    for split, classes in zip(SPLITS, (64, 16, 20), strict=True):
        images = load_cifarfs(root, split, cache_dir=shared_cache)
        assert images.images.shape == (classes * 600, 3, 32, 32) and images.images.dtype == torch.uint8
        assert torch.equal(torch.bincount(images.labels), torch.full((classes,), 600))
        listed = (root / "splits" / f"{split}.txt").read_text().split()
        assert images.class_names == sorted(listed) == sorted(CIFARFS_CLASSES[split])


@pytest.mark.data
def test_miniimagenet_classes_follow_the_csv_split(shared_cache):
    root = shared("miniimagenet")
    for split, (classes, per_class) in zip(SPLITS, ((64, 100), (16, 200), (20, 200)), strict=True):
        images = load_miniimagenet(root, split, cache_dir=shared_cache)
        csv_rows = read_split_csv(root / "splits" / f"{split}.csv")
        assert images.class_names == sorted({label for _, label in csv_rows})
        assert images.images.shape == (classes * per_class, 3, 84, 84)
        assert torch.equal(torch.bincount(images.labels), torch.full((classes,), per_class))


def episode_of(data, stage: str = "fit"):
    data.setup(stage)
    return next(iter(data.train_dataloader())), next(iter(data.val_dataloader()))


@pytest.mark.data
@pytest.mark.parametrize(
    ("name", "shape", "n_way", "k_shot", "query_shots"),
    [
        ("omniglot", (1, 28, 28), 20, 1, 1),
        ("cifarfs", (3, 32, 32), 5, 5, 2),
        ("miniimagenet", (3, 84, 84), 5, 1, 2),
    ],
    ids=["omniglot-20w1s", "cifarfs-5w5s", "miniimagenet-5w1s"],
)
def test_an_episode_of_each_dataset(shared_cache, name, shape, n_way, k_shot, query_shots):
    module = {"omniglot": OmniglotDataModule, "cifarfs": CIFARFSDataModule, "miniimagenet": MiniImageNetDataModule}
    data = module[name](
        root=str(shared(name)),
        cache_dir=str(shared_cache),
        sampler=MultiQuerySampler(tasks=2, query_sets=3),
        n_way=n_way,
        k_shot=k_shot,
        query_shots=query_shots,
        eval_query_shots=15 if name != "omniglot" else 1,
        val_tasks=2,
        eval_batch_tasks=2,
    )
    assert data.image_shape == shape and data.n_way == n_way
    train, val = episode_of(data)
    assert train.support_x.shape == (2, n_way * k_shot, *shape)
    assert train.query_x.shape == (2, 3, n_way * query_shots, *shape)
    for labels in (train.support_y, val.support_y):
        per_label = torch.full((n_way,), labels.numel() // n_way)
        assert torch.equal(torch.bincount(labels.flatten(), minlength=n_way), per_label)
    # Each support image of a label is an image of the split class the task assigns to that label.
    split = data.split("val")
    for task in range(2):
        for label, split_class in enumerate(val.classes[task].tolist()):
            members = split.gather((split.labels == split_class).nonzero().flatten())
            for x in val.support_x[task][val.support_y[task] == label]:
                assert (members == x).flatten(1).all(dim=1).any()
    if name == "miniimagenet":  # ImageNet normalisation: roughly zero-mean, unit-variance channels
        pixels = data.split("val").gather(torch.arange(0, 3200, 7))
        assert pixels.mean(dim=(0, 2, 3)).abs().max() < 0.5 and 0.5 < pixels.std() < 1.5
    else:
        assert 0.0 <= float(train.support_x.min()) and float(train.support_x.max()) <= 1.0


@pytest.mark.data
def test_omniglot_gives_964_plus_659_characters(shared_cache):
    from units_lightning.data.datasets.omniglot import load_omniglot

    images, names = load_omniglot(shared("omniglot"), cache_dir=shared_cache)
    alphabets = [name.split("/")[0] for name in names]
    assert images.shape[:2] == (964 + 659, 20)
    assert len(set(alphabets[:964])) == 30 and len(set(alphabets[964:])) == 20


@pytest.mark.data
@pytest.mark.parametrize(
    ("name", "shape", "count", "classes"),
    [
        ("mnist", (1, 28, 28), 10_000, 10),
        ("fashion_mnist", (3, 32, 32), 10_000, 10),
        ("gtsrb", (3, 32, 32), 516, 43),
        ("gtsrb", (1, 28, 28), 516, 43),
    ],
    ids=["mnist-like-omniglot", "fashion-like-cifarfs", "gtsrb-like-cifarfs", "gtsrb-like-omniglot"],
)
def test_ood_sets_take_the_target_shape(shared_cache, name, shape, count, classes):
    ood = load_ood(name, shared("ood"), shape, cache_dir=shared_cache)
    assert ood.images.shape == (count, *shape) and ood.num_classes == classes and ood.split == f"ood-{name}"
    pixels = ood.gather(torch.arange(0, count, 5))
    assert pixels.dtype == torch.float32 and 0.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0
    assert float(pixels.std()) > 0.05  # real images, not blanks
    if shape[0] == 3 and name != "gtsrb":  # grey sources replicated to RGB
        assert torch.equal(ood.images[:, 0], ood.images[:, 1])


@pytest.mark.data
def test_ood_normalised_like_the_target(shared_cache):
    plain = load_ood("gtsrb", shared("ood"), (3, 84, 84), cache_dir=shared_cache)
    normalised = load_ood("gtsrb", shared("ood"), (3, 84, 84), shared_cache, IMAGENET_MEAN, IMAGENET_STD)
    index = torch.arange(10)
    expected = (plain.gather(index) - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[
        :, None, None
    ]
    torch.testing.assert_close(normalised.gather(index), expected)

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.cli import cli_main
from units_lightning.data import EpisodicDataModule, OmniglotDataModule, TensorImages
from units_lightning.samplers import MultiQuerySampler, RandomSampler


class RecordSteps(Callback):
    def __init__(self):
        self.steps, self.classes = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append(batch.step)
        self.classes.append(batch.classes.clone())


def test_batches_have_the_promised_shapes_and_sealed_labels():
    data = tiny_data(MultiQuerySampler(tasks=3, query_sets=4), k_shot=2, query_shots=2)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch.support_x.shape == (3, 10, 1, 16, 16) and batch.support_y.shape == (3, 10)
    assert batch.query_x.shape == (3, 4, 10, 1, 16, 16) and batch.query_y.shape == (3, 4, 10)
    assert not isinstance(batch.query_y, torch.Tensor)
    assert batch.support_x.dtype == torch.float32 and 0.0 <= batch.support_x.min() <= batch.support_x.max() <= 1.0


def test_stream_continues_at_the_global_step_across_epochs_and_resume(tmp_path):
    uninterrupted = RecordSteps()
    data = tiny_data(RandomSampler(tasks=2))
    tiny_trainer(tmp_path, max_steps=6, limit_train_batches=2, callbacks=[uninterrupted]).fit(
        tiny_model(sampler=data.sampler), data
    )
    assert uninterrupted.steps == [0, 1, 2, 3, 4, 5]

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    data = tiny_data(RandomSampler(tasks=2))
    tiny_trainer(tmp_path, max_steps=3, limit_train_batches=2, callbacks=[checkpoint], enable_checkpointing=True).fit(
        tiny_model(sampler=data.sampler), data
    )
    resumed = RecordSteps()
    data = tiny_data(RandomSampler(tasks=2))
    tiny_trainer(tmp_path, max_steps=6, limit_train_batches=2, callbacks=[resumed]).fit(
        tiny_model(sampler=data.sampler), data, ckpt_path=tmp_path / "ckpt" / "last.ckpt"
    )
    assert resumed.steps == [3, 4, 5]
    for a, b in zip(resumed.classes, uninterrupted.classes[3:], strict=True):
        assert torch.equal(a, b), "a resumed run must see the same tasks as an uninterrupted one"


def test_evaluation_tasks_are_fixed_and_independent_of_batching():
    def val_classes(batch_tasks):
        data = tiny_data(RandomSampler(tasks=2), val_tasks=6, eval_batch_tasks=batch_tasks)
        data.setup("validate")
        return torch.cat([b.classes for b in data.val_dataloader()])

    assert torch.equal(val_classes(2), val_classes(4))
    assert val_classes(4).shape == (6, 5)


def test_evaluation_tasks_are_drawn_once_and_every_later_pass_repeats_them(monkeypatch):
    data = tiny_data(RandomSampler(tasks=2), val_tasks=6, eval_batch_tasks=4)
    data.setup("validate")
    loader = data.val_dataloader()
    first = list(loader)
    sampler = loader.dataset.sampler
    calls = []
    monkeypatch.setattr(sampler, "sample", lambda *args: calls.append(args) or pytest.fail("drew a task again"))
    again = list(loader)  # a later validation of the same fit: the kept tasks, the same images and labels
    assert calls == [] and len(again) == len(first) == 2
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a.classes, b.classes) and torch.equal(a.support_x, b.support_x)
        assert torch.equal(a.query_x, b.query_x) and torch.equal(a.support_y, b.support_y)
        assert a.classes.data_ptr() != b.classes.data_ptr()  # fresh tensors: a consumer may change its batch


def test_seed_changes_the_training_stream():
    def first_classes(seed):
        data = tiny_data(RandomSampler(tasks=2), seed=seed)
        data.setup("fit")
        return next(iter(data.train_dataloader())).classes

    assert torch.equal(first_classes(0), first_classes(0))
    assert not torch.equal(first_classes(0), first_classes(1))


def test_workers_draw_the_same_stream_as_the_main_process():
    def classes(workers):
        data = tiny_data(RandomSampler(tasks=2), num_workers=workers)
        data.setup("fit")
        loader = iter(data.train_dataloader())
        return torch.stack([next(loader).classes for _ in range(4)])

    assert torch.equal(classes(0), classes(2))


def test_user_splits_in_memory():
    images = torch.randint(0, 255, (60, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(6).repeat_interleave(10)
    split = TensorImages(images, labels, [f"c{i}" for i in range(6)])
    data = EpisodicDataModule(RandomSampler(tasks=2), n_way=3, splits={"train": split, "val": split})
    data.setup("fit")
    assert data.image_shape == (1, 8, 8)
    assert next(iter(data.train_dataloader())).support_x.shape == (2, 3, 1, 8, 8)


def test_missing_omniglot_root_fails_before_training_and_says_how_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="download"):
        cli_main(
            [
                "fit",
                "--config",
                "configs/omniglot_5w1s.yaml",
                f"--data.root={tmp_path / 'nowhere'}",
                f"--data.cache_dir={tmp_path / 'cache'}",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )


def test_corrupt_image_is_named_before_training(tmp_path):
    from PIL import Image

    for split in ("images_background", "images_evaluation"):
        for character in range(2):
            folder = tmp_path / "root" / split / "Alphabet" / f"character{character:02d}"
            folder.mkdir(parents=True)
            for drawing in range(3):
                Image.new("1", (105, 105), 1).save(folder / f"{drawing:02d}.png")
    (tmp_path / "root" / "images_evaluation" / "Alphabet" / "character01" / "02.png").write_bytes(b"not a png")
    data = OmniglotDataModule(
        root=str(tmp_path / "root"), cache_dir=str(tmp_path / "cache"), n_way=2, split_sizes=(2, 1, 1)
    )
    with pytest.raises(ValueError, match=r"character01.02\.png"):
        tiny_trainer(tmp_path).fit(tiny_model(n_way=2, image_shape=(1, 28, 28), sampler=data.sampler), data)

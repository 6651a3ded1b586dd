"""The episodic DataModule: turns a class-indexed image collection into meta-batches of tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from units_lightning.data.datasets.images import FewShotImages
from units_lightning.episode import EpisodeIndices, EpisodeSpec, SealedLabels, TaskBatch
from units_lightning.samplers.base import TaskSampler
from units_lightning.samplers.random import RandomSampler

__all__ = [
    "EpisodeDataset",
    "EpisodeLoader",
    "EpisodicDataModule",
    "ShardSampler",
    "StepSampler",
    "build_batch",
    "evaluation_shard",
]

_STREAMS = {"train": 0, "val": 1, "test": 2}


def build_batch(images: FewShotImages, indices: EpisodeIndices, step: int = 0) -> TaskBatch:
    """Load the images of drawn episodes (one ``gather`` call) and seal their query labels."""
    support, query = indices.support, indices.query
    flat = torch.from_numpy(np.concatenate([support.reshape(-1), query.reshape(-1)]))
    pixels = images.gather(flat)
    shape = pixels.shape[1:]
    return TaskBatch(
        support_x=pixels[: support.size].reshape(*support.shape, *shape),
        support_y=torch.from_numpy(indices.support_labels),
        query_x=pixels[support.size :].reshape(*query.shape, *shape),
        query_y=SealedLabels(torch.from_numpy(indices.query_labels)),
        classes=torch.from_numpy(indices.classes),
        step=step,
    )


def _concatenate(parts: list[EpisodeIndices]) -> EpisodeIndices:
    return EpisodeIndices(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("classes", "support", "support_labels", "query", "query_labels")
        )
    )


def evaluation_shard(num_tasks: int, rank: int = 0, world_size: int = 1, option: str = "num_tasks") -> range:
    """The fixed evaluation tasks that process ``rank`` of ``world_size`` evaluates: a contiguous block of them.

    Every task goes to exactly one process and the blocks differ in size by at most one task. Unlike
    ``DistributedSampler``, nothing is repeated to even them out, so metrics summed over processes count each
    task once. In rank order the blocks are the task list in order, so the states that processes gather (the
    ranking metrics' per-query lists) hold the queries in the order one process would.

    Args:
        num_tasks: evaluation tasks in all; rank: this process; world_size: the number of processes.
        option: the setting that gave ``num_tasks``, named in the error (``data.val_tasks``).

    Example:
        >>> [list(evaluation_shard(7, rank, world_size=2)) for rank in range(2)]
        [[0, 1, 2], [3, 4, 5, 6]]

    Raises:
        ValueError: if there are fewer tasks than processes: a process without a task would skip the
            evaluation and leave the others waiting for it when they sum their metrics.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in 0 .. {world_size - 1} for {world_size} processes, got {rank}")
    if num_tasks < world_size:
        raise ValueError(
            f"{option}={num_tasks} is fewer than the {world_size} processes of this run: under data-parallel "
            f"evaluation every process evaluates at least one task. Raise {option} to at least {world_size}, or "
            "evaluate on fewer devices"
        )
    return range(rank * num_tasks // world_size, (rank + 1) * num_tasks // world_size)


class EpisodeDataset(Dataset):
    """Item ``i`` is a meta-batch drawn by ``sampler`` from a generator seeded by (seed, stream, rank, i).

    Training asks for item ``global_step``; so a resumed run, every DDP rank (through ``rank``) and every
    data-loader worker draws its own reproducible tasks with no sampler state to save.

    With ``tasks_per_item`` set (evaluation), item ``i`` holds tasks ``i * tasks_per_item ...`` of ``tasks``
    (default: all ``num_tasks``; under data-parallel evaluation, this process's ``evaluation_shard``), the last
    item fewer where they do not divide. Each task is drawn from its own generator, seeded by its number among
    all ``num_tasks``, so the fixed evaluation tasks depend neither on how they are batched nor on how many
    processes share them. Each evaluation task is drawn once and kept (its indices, not its images): every later
    validation of the same fit reuses it.
    """

    def __init__(
        self,
        images: FewShotImages,
        sampler: TaskSampler,
        seed: int,
        stream: str,
        rank: int = 0,
        num_tasks: int | None = None,
        tasks_per_item: int | None = None,
        tasks: range | None = None,
    ):
        self.images, self.sampler = images, sampler
        self.seed, self.stream, self.rank = seed, _STREAMS[stream], rank
        self.num_tasks, self.tasks_per_item = num_tasks, tasks_per_item
        self.tasks = tasks if tasks is not None else range(num_tasks or 0)
        self._drawn: dict[int, EpisodeIndices] = {}  # evaluation task number -> its indices
        if num_tasks is not None and len(self.tasks) and not 0 <= min(self.tasks) <= max(self.tasks) < num_tasks:
            raise ValueError(f"tasks must lie in 0 .. {num_tasks - 1}, got {self.tasks}")

    def _rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.stream, self.rank, index])

    def __len__(self) -> int:
        if self.num_tasks is None or self.tasks_per_item is None:
            raise TypeError("a training episode stream has no length")
        return -(-len(self.tasks) // self.tasks_per_item)

    def __getitem__(self, index: int) -> TaskBatch:
        if self.tasks_per_item is None:
            return build_batch(self.images, self.sampler.sample(self._rng(index), index), step=index)
        if not 0 <= index < len(self):
            raise IndexError(f"evaluation batch {index} out of range: {len(self)} batches")
        tasks = self.tasks[index * self.tasks_per_item : (index + 1) * self.tasks_per_item]
        return build_batch(self.images, _concatenate([self._evaluation_task(t) for t in tasks]), index)

    def _evaluation_task(self, task: int) -> EpisodeIndices:
        if task not in self._drawn:
            self._drawn[task] = self.sampler.sample(self._rng(task), task)
        return self._drawn[task]


class StepSampler(DistributedSampler):
    """Yields ``start(), start() + 1, ...`` without end: the step numbers of the episodes to draw.

    ``start`` is read each time an epoch begins (in the main process, also with workers), so that the
    stream continues at the trainer's ``global_step`` after an epoch boundary or a resume.

    Every rank yields the same step numbers and draws its own tasks for them, because the rank is part of
    the episode seed. The class derives from ``DistributedSampler`` only to say so to Lightning, which
    would otherwise wrap it in a sampler that splits indices between ranks (and needs a length).
    """

    def __init__(self, start: Callable[[], int]):
        # DistributedSampler.__init__ is skipped on purpose: it wants a sized dataset and splits it by rank.
        self.start = start
        self.epoch = 0

    def __len__(self) -> int:
        raise TypeError("the episode stream is endless: bound an epoch with trainer.limit_train_batches")

    def __iter__(self) -> Iterator[int]:
        step = self.start()
        while True:
            yield step
            step += 1


class ShardSampler(DistributedSampler):
    """Yields ``0, 1, ..., num_items - 1`` once: every evaluation batch of this process's share, in order.

    The dataset holds only this process's tasks already (``evaluation_shard``). The class derives from
    ``DistributedSampler`` only to say so to Lightning, which would otherwise replace it (``use_distributed_sampler``)
    with a ``DistributedSampler`` that splits the batches again and repeats some to even out the processes.
    """

    def __init__(self, num_items: int):
        # DistributedSampler.__init__ is skipped on purpose: it would split the items by rank a second time.
        self.num_items = num_items
        self.epoch, self.shuffle = 0, False

    def __len__(self) -> int:
        return self.num_items

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_items))


def _identity(batch: TaskBatch) -> TaskBatch:
    return batch


class EpisodeLoader(DataLoader):
    """The training loader. Its position is the trainer's ``global_step`` (read by ``StepSampler``), which
    the checkpoint already holds, so it resumes mid-epoch exactly and has no state of its own to save."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class EpisodicDataModule(pl.LightningDataModule):
    """Meta-batches of few-shot tasks from any class-indexed image dataset.

    Training batches come from ``sampler`` (random, Units-ST, multi-query, or your own ``TaskSampler``),
    one meta-batch per step. Validation and test use fixed, seeded tasks of one query set each with
    ``eval_query_shots`` queries per class. Subclasses provide the splits by overriding ``make_split``;
    to use your own in-memory data, pass ``splits`` instead.

    Under data-parallel training every process draws its own training tasks (the rank is part of their seed;
    rank 0 draws those of a single-process run), and evaluates a contiguous block of the fixed validation and
    test tasks (``evaluation_shard``): every task once, so metrics summed over processes are those of one.

    Args:
        sampler: task sampler for training (default: ``RandomSampler(tasks=8)``).
        n_way: classes per task.
        k_shot: support images per class.
        query_shots: query images per class in each training query set.
        eval_query_shots: query images per class in validation and test tasks (default: ``query_shots``).
        val_tasks: number of fixed validation tasks (at least one per process).
        test_tasks: number of fixed test tasks (at least one per process).
        eval_batch_tasks: evaluation tasks per batch (each process's last batch holds what is left).
        seed: seed of every episode stream (training, validation, test differ by stream id).
        num_workers: data-loader worker processes.
        splits: ready-made ``{"train": ..., "val": ..., "test": ...}`` collections (optional).

    Raises:
        ValueError: at ``setup`` when a split cannot provide the requested episodes (too few classes or
            too few images per class), before any training step.
    """

    image_shape: tuple[int, int, int] = (1, 28, 28)

    def __init__(
        self,
        sampler: TaskSampler | None = None,
        n_way: int = 5,
        k_shot: int = 1,
        query_shots: int = 1,
        eval_query_shots: int | None = None,
        val_tasks: int = 100,
        test_tasks: int = 600,
        eval_batch_tasks: int = 10,
        seed: int = 0,
        num_workers: int = 0,
        splits: Mapping[str, FewShotImages] | None = None,
    ):
        super().__init__()
        self.sampler = sampler if sampler is not None else RandomSampler(tasks=8)
        self.spec = EpisodeSpec(n_way, k_shot, query_shots)
        self.eval_spec = EpisodeSpec(n_way, k_shot, eval_query_shots or query_shots)
        for name, value in (
            ("val_tasks", val_tasks),
            ("test_tasks", test_tasks),
            ("eval_batch_tasks", eval_batch_tasks),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.val_tasks, self.test_tasks, self.eval_batch_tasks = val_tasks, test_tasks, eval_batch_tasks
        self.seed, self.num_workers = seed, num_workers
        self._given = dict(splits or {})
        if self._given:
            self.image_shape = next(iter(self._given.values())).image_shape
        self._splits: dict[str, FewShotImages] = {}
        self._eval_samplers: dict[str, TaskSampler] = {}

    @property
    def n_way(self) -> int:
        return self.spec.n_way

    def make_split(self, split: str) -> FewShotImages:
        """The image collection of ``split`` ("train", "val" or "test"). Subclasses override."""
        if split not in self._given:
            raise ValueError(f"no '{split}' split: pass splits={{'{split}': ...}} or use a dataset-specific DataModule")
        return self._given[split]

    def split(self, name: str) -> FewShotImages:
        """The (cached) collection of split ``name``."""
        if name not in self._splits:
            self._splits[name] = self.make_split(name).to(self._images_device)
        return self._splits[name]

    @property
    def _images_device(self) -> torch.device:
        """Where the splits keep their pixels: on the training GPU when batches are built in the main process
        (``num_workers=0``), so that a batch is gathered there instead of copied there at every step."""
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        return device if device.type == "cuda" and self.num_workers == 0 else torch.device("cpu")

    def setup(self, stage: str | None = None) -> None:
        """Build the splits the stage needs and check every requested episode shape against them."""
        needed = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}.get(
            stage or "fit", ("train", "val", "test")
        )
        for name in needed:
            images = self.split(name)
            if name == "train":
                self.sampler.bind(images.labels, self.spec, split=name)
            else:
                evaluator = TaskSampler(tasks=1, query_sets=1)
                evaluator.bind(images.labels, self.eval_spec, split=name)
                self._eval_samplers[name] = evaluator

    @property
    def _rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def _loader(self, dataset: Dataset, loader: type[DataLoader] = DataLoader, **kwargs) -> DataLoader:
        return loader(
            dataset,
            batch_size=None,
            collate_fn=_identity,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self._pins_memory,
            **kwargs,
        )

    @property
    def _pins_memory(self) -> bool:
        """Pinned batches on CUDA: their copy to the GPU then runs asynchronously instead of waiting for the GPU."""
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        if self.sampler.spec is None:
            self.setup("fit")
        dataset = EpisodeDataset(self.split("train"), self.sampler, self.seed, "train", self._rank)
        start = (lambda: self.trainer.global_step) if self.trainer is not None else (lambda: 0)
        return self._loader(dataset, EpisodeLoader, sampler=StepSampler(start))

    def _eval_loader(self, name: str, num_tasks: int) -> DataLoader:
        if name not in self._eval_samplers:
            self.setup({"val": "validate", "test": "test"}[name])
        dataset = EpisodeDataset(
            self.split(name),
            self._eval_samplers[name],
            self.seed,
            name,
            rank=0,  # the fixed tasks are the same for every process; each evaluates its share of them
            num_tasks=num_tasks,
            tasks_per_item=self.eval_batch_tasks,
            tasks=evaluation_shard(num_tasks, self._rank, self._world_size, option=f"data.{name}_tasks"),
        )
        return self._loader(dataset, sampler=ShardSampler(len(dataset)))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val", self.val_tasks)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test", self.test_tasks)

    def predict_dataloader(self) -> DataLoader:
        """The fixed test tasks (their labels are not read by ``predict``)."""
        return self._eval_loader("test", self.test_tasks)

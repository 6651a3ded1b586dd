"""``AnnotatedTasksDataModule``: train on an annotation project's support sets and the query sets labeled so far."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader

from units_lightning.annotation.episodes import LabeledEpisodes, check_tasks, labeled_tasks
from units_lightning.annotation.holdout import HeldOutEpisodes, HeldOutSet, check_share, held_out_sets
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.layout import AnnotationProject, load_project
from units_lightning.data.episodic import (
    EpisodeLoader,
    EpisodicDataModule,
    ShardSampler,
    StepSampler,
    evaluation_shard,
)

__all__ = ["AnnotatedTasksDataModule"]

LABELS_NAME = "labels.json"


class AnnotatedTasksDataModule(EpisodicDataModule):
    """Episodes of an annotation project (``tasks/<task>/support/<class>/``, ``tasks/<task>/unlabeled/``): every
    task's support set with the query sets people labeled so far, read from the label store at every ``setup``.

    ``fit`` trains on them as on any episodic data (the sampler chooses among each task's labeled query sets, the
    ledger reveals the chosen ones); ``units-lightning select`` reads the same options to find the project, its
    label store, the image shape and the size of a query set (``n_way * query_shots`` images).

    With ``val_share`` above 0, that share of the labeled query sets is held out: never trained on, they are the
    validation tasks (each with ``k_shot`` support images per class of its task) and ``test`` evaluates them too,
    so that ``val/acc`` is logged, a ``ModelCheckpoint`` monitoring it records the best checkpoint and ``test
    --ckpt_path best`` works. Which sets are held out depends on the seed and on the order in which they were
    ingested only (``holdout``), so a set keeps its role from round to round. Until enough sets are labeled for
    the first one to be held out, ``fit`` says so, with the number needed, and trains without validation. The best
    checkpoint is chosen on these same sets, so its test accuracy here is optimistic: for an unbiased number, test
    on labeled tasks of another data module (``benchmarks/annotation_rounds.py`` uses Omniglot's test characters).

    Args:
        root: the project folder.
        labels: the label store (default ``<root>/labels.json``).
        image_size: side of the square images (every image is resized to it, bicubic).
        channels: 1 (grey) or 3 (RGB); images are converted.
        val_share: the share of labeled query sets held out for validation and test, in ``[0, 1)``; 0: every
            label trains and there is no validation.
        adapt_on_labels: ``select`` and ``serve`` adapt to each task's support set and the images people labeled
            in it so far, every class weighing the same (``selection.adapted_evidence``), instead of to its support
            set alone; ``fit`` and ``test`` are unchanged.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, query_shots, seed,
            eval_batch_tasks, ...).

    Raises:
        ValueError: ``val_share`` outside ``[0, 1)``; at ``setup``: the project's tasks do not have ``n_way``
            classes with ``k_shot`` support images each, no query set is labeled yet (or all are held out), the
            store does not match the project (named in the message), or ``validate``/``test`` find no held-out set.
    """

    def __init__(
        self,
        root: str = "annotation",
        labels: str | None = None,
        image_size: int = 28,
        channels: int = 1,
        val_share: float = 0.0,
        adapt_on_labels: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        if val_share != 0:
            check_share(val_share)
        self.root = Path(root)
        self.labels = Path(labels) if labels is not None else self.root / LABELS_NAME
        self.image_size, self.channels = image_size, channels
        self.image_shape = (channels, image_size, image_size)
        self.val_share = val_share
        self.adapt_on_labels = adapt_on_labels
        self._episodes: LabeledEpisodes | None = None
        self._held_out: list[HeldOutSet] = []

    @property
    def query_set_size(self) -> int:
        """Images in one query set: ``n_way * query_shots``."""
        return self.spec.n_way * self.spec.query_shots

    def project(self) -> AnnotationProject:
        """The project's tasks, checked against the episode shape (``n_way`` classes of ``k_shot`` images)."""
        project = load_project(self.root)
        check_tasks(project, self.spec)
        return project

    def label_store(self) -> LabelStore:
        return LabelStore.load(self.labels)

    def setup(self, stage: str | None = None) -> None:
        """Read the project and its labels, again at every ``fit`` (a round's answers arrive between two fits), and
        hold out ``val_share`` of the labeled query sets.

        Raises:
            ValueError: for ``predict``; for ``validate`` and ``test`` when no query set is held out (``val_share``
                is 0, or too few sets are labeled yet).
        """
        if stage not in (None, "fit", "validate", "test"):
            raise ValueError(
                f"AnnotatedTasksDataModule serves `fit`, `validate` and `test`, not `{stage}`: predict the unlabeled "
                "images with `units-lightning select` or `serve` (docs/ANNOTATION.md)"
            )
        evaluates = stage in ("validate", "test")
        if self.val_share == 0 and evaluates:
            raise ValueError(
                f"`{stage}` on an annotation project needs held-out query sets, but data.val_share is 0 (every label "
                "trains): fit with data.val_share 0.2 (configs/annotation.yaml), or test on labeled tasks of another "
                "data module"
            )
        store = self.label_store()
        held_out, labeled, needed = held_out_sets(store, self.val_share, self.seed) if self.val_share else (set(), 0, 0)
        images, tasks, self._held_out = labeled_tasks(
            self.project(), store, self.spec, self.image_shape, held_out=held_out
        )
        if self.val_share:
            if self._held_out:
                message = (
                    f"validation: {len(self._held_out)} of the {labeled} labeled query sets held out "
                    f"(data.val_share {self.val_share:g}), never trained on"
                )
            else:
                message = (
                    f"cannot validate: none of the {labeled} labeled query set(s) is held out yet; data.val_share "
                    f"{self.val_share:g} holds out one in every {1 / self.val_share:g}, the first when {needed} are "
                    f"labeled (seed {self.seed}). Label {needed - labeled} more query set(s) (select, ingest) to "
                    "validate; until then fit logs no validation accuracy and records no best checkpoint "
                    "(--ckpt_path best)"
                )
                if evaluates:
                    raise ValueError(f"`{stage}`: {message}")
            if rank_zero_only.rank == 0:
                print(f"{self.root}: {message}", flush=True)
        sampler = self.sampler
        self._episodes = LabeledEpisodes(
            images.to(self._images_device),
            tasks,
            sampler.num_candidates,
            sampler.query_sets,
            self.spec.k_shot,
            self.seed,
            self._rank,
        )

    def train_dataloader(self) -> DataLoader:
        if self._episodes is None:
            self.setup("fit")
        start = (lambda: self.trainer.global_step) if self.trainer is not None else (lambda: 0)
        return self._loader(self._episodes, EpisodeLoader, sampler=StepSampler(start))

    def _held_out_loader(self, stage: str) -> DataLoader | list:
        if self._episodes is None:
            self.setup(stage)
        if not self._held_out:
            return []
        shard = evaluation_shard(
            len(self._held_out), self._rank, self._world_size, option="the held-out query sets (data.val_share)"
        )
        dataset = HeldOutEpisodes(
            self._episodes.images, self._held_out, self.spec.k_shot, self.seed, self.eval_batch_tasks, shard
        )
        return self._loader(dataset, sampler=ShardSampler(len(dataset)))

    def val_dataloader(self) -> DataLoader | list:
        """The held-out query sets, one evaluation task each; none where nothing is held out."""
        return self._held_out_loader("validate")

    def test_dataloader(self) -> DataLoader | list:
        """The held-out query sets again: the project has no other labels."""
        return self._held_out_loader("test")

    def predict_dataloader(self) -> list:
        return []

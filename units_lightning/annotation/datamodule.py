"""``AnnotatedTasksDataModule``: train on an annotation project's support sets and the query sets labeled so far."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from units_lightning.annotation.episodes import LabeledEpisodes, check_tasks, labeled_tasks
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.layout import AnnotationProject, load_project
from units_lightning.data.episodic import EpisodeLoader, EpisodicDataModule, StepSampler

__all__ = ["AnnotatedTasksDataModule"]

LABELS_NAME = "labels.json"


class AnnotatedTasksDataModule(EpisodicDataModule):
    """Episodes of an annotation project (``tasks/<task>/support/<class>/``, ``tasks/<task>/unlabeled/``): every
    task's support set with the query sets people labeled so far, read from the label store at every ``setup``.

    ``fit`` trains on them as on any episodic data (the sampler chooses among each task's labeled query sets, the
    ledger reveals the chosen ones); ``units-lightning select`` reads the same options to find the project, its
    label store, the image shape and the size of a query set (``n_way * query_shots`` images). There is no
    validation or test split: every label of the project is for training. Measure accuracy on labeled tasks of
    another data module (``benchmarks/annotation_rounds.py`` uses Omniglot's test characters).

    Args:
        root: the project folder.
        labels: the label store (default ``<root>/labels.json``).
        image_size: side of the square images (every image is resized to it, bicubic).
        channels: 1 (grey) or 3 (RGB); images are converted.
        **kwargs: the episode options of ``EpisodicDataModule`` (sampler, n_way, k_shot, query_shots, seed, ...).

    Raises:
        ValueError: at ``setup``: the project's tasks do not have ``n_way`` classes with ``k_shot`` support images
            each, no query set is labeled yet, or the store does not match the project (named in the message).
    """

    def __init__(
        self,
        root: str = "annotation",
        labels: str | None = None,
        image_size: int = 28,
        channels: int = 1,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        self.root = Path(root)
        self.labels = Path(labels) if labels is not None else self.root / LABELS_NAME
        self.image_size, self.channels = image_size, channels
        self.image_shape = (channels, image_size, image_size)
        self._episodes: LabeledEpisodes | None = None

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
        """Read the project and its labels, again at every ``fit`` (a round's answers arrive between two fits).

        Raises:
            ValueError: for ``validate``, ``test`` and ``predict``: the project has no split for them.
        """
        if stage not in (None, "fit"):
            raise ValueError(
                f"AnnotatedTasksDataModule serves `fit` only, not `{stage}`: every label of the project trains. "
                "Validate or test the checkpoint with a data module of labeled tasks"
            )
        images, tasks = labeled_tasks(self.project(), self.label_store(), self.spec, self.image_shape)
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

    def val_dataloader(self) -> list:
        """No validation batches: the project's labels all train."""
        return []

    def test_dataloader(self) -> list:
        return []

    def predict_dataloader(self) -> list:
        return []

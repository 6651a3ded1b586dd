"""``MilestoneCheckpoint``: one checkpoint at each given count of labeled query sets, so one run gives every budget
point of a label-budget table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

__all__ = ["MilestoneCheckpoint"]

MILESTONE_FOLDER = "milestones"


class MilestoneCheckpoint(Callback):
    """Save a checkpoint when the label ledger reaches each of ``milestones`` labeled query sets, once per milestone.

    The paper's label-budget tables report test accuracy after 4,000, 8,000 and 10,000 labeled query sets of one
    training run; this callback writes those checkpoints (``labels-04000.ckpt``, ...), to be tested like any
    other (``units-lightning test --ckpt_path .../labels-04000.ckpt``). The count is the module's
    ``ledger.query_sets`` (``UnitsMAML``'s ``LabelLedger``; under data-parallel training it already counts every
    rank, so all ranks reach a milestone at the same step), read once per training step in ``on_train_batch_end``,
    after the step's meta-update: a file holds the weights trained on the labels counted so far. A step that
    crosses a milestone saves it, also when it labels more than needed to reach it exactly.

    Files are written by ``trainer.save_checkpoint`` (rank zero writes, through the trainer's checkpoint IO: with
    the ``units-lightning`` command ``AtomicCheckpointIO``, so a kill during a save leaves no partial file). They
    are complete checkpoints, a run can also be continued from one.

    Exactly once across resumes: the milestones already handled are part of every checkpoint the run writes, and
    Lightning runs this callback's ``on_train_batch_end`` before a ``ModelCheckpoint``'s, so a ``last.ckpt``
    written at a step that crossed a milestone already records it. A run resumed past a milestone does not save
    it again; one stopped just before a milestone saves it when the resumed run reaches it. A run resumed from a
    checkpoint that holds no record of this callback (it was added to the config later) cannot tell which
    milestones were passed before the resume: those reached by its first step count as saved where their file
    exists in the folder, and are otherwise given up with a warning rather than saved from weights that may be
    past them.

    Args:
        milestones: counts of labeled query sets at which to save (the paper: ``[4000, 8000, 10000]``).
        dirpath: folder of the files. Default: ``milestones/`` inside the folder of the trainer's first
            ``ModelCheckpoint`` (``runs/<config>/<project>/<run id>/checkpoints/milestones``), else
            ``<default_root_dir>/checkpoints/milestones``. A folder of its own, so that a ``CheckpointEnsemble``
            over the checkpoint folder never ranks a milestone among the best checkpoints.
        filename: file name without ``.ckpt``, formatted with the milestone as ``labels``.

    Attributes:
        passed: milestones handled by this run (saved, or given up after an unrecorded resume).
        paths: milestone -> file written.

    Example:
        >>> MilestoneCheckpoint([8000, 4000]).file_name(4000)
        'labels-04000.ckpt'
    """

    def __init__(self, milestones: Sequence[int], dirpath: str | None = None, filename: str = "labels-{labels:05d}"):
        counts = [int(m) for m in milestones]
        if not counts or any(m < 1 for m in counts) or len(set(counts)) != len(counts):
            raise ValueError(
                "milestones must be distinct counts of labeled query sets >= 1 (e.g. [4000, 8000, 10000]), "
                f"got {counts}"
            )
        try:
            names = {filename.format(labels=m) for m in counts}
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"filename {filename!r} cannot be formatted with the milestone as 'labels' ({error}): use e.g. "
                "'labels-{labels:05d}'"
            ) from error
        if len(names) != len(counts):
            raise ValueError(
                f"filename {filename!r} gives the same name to several milestones: include the count, e.g. "
                "'labels-{labels:05d}'"
            )
        self.milestones = tuple(sorted(counts))
        self.dirpath, self.filename = dirpath, filename
        self.passed: set[int] = set()
        self.paths: dict[int, str] = {}
        self._resumed_without_record = False
        self._labeled: int | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(filename=self.filename)

    def file_name(self, milestone: int) -> str:
        """The file name of ``milestone``'s checkpoint."""
        return self.filename.format(labels=milestone) + ".ckpt"

    def folder(self, trainer: pl.Trainer) -> Path:
        """Where the files go: ``dirpath``, else ``milestones/`` beside the first ``ModelCheckpoint``'s files."""
        if self.dirpath is not None:
            return Path(self.dirpath)
        checkpoint = trainer.checkpoint_callback
        base = getattr(checkpoint, "dirpath", None)
        if base is None:
            base = Path(trainer.default_root_dir) / "checkpoints"
        return Path(base) / MILESTONE_FOLDER

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not hasattr(getattr(pl_module, "ledger", None), "query_sets"):
            raise TypeError(
                "MilestoneCheckpoint counts labeled query sets with the module's label ledger "
                "(pl_module.ledger.query_sets): use it with units_lightning.UnitsMAML, or a module that keeps one"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.fast_dev_run:  # as ModelCheckpoint: a smoke run writes no checkpoints
            return
        labeled = int(pl_module.ledger.query_sets)
        self._labeled = labeled
        due = [m for m in self.milestones if m <= labeled and m not in self.passed]
        if self._resumed_without_record:
            self._resumed_without_record = False
            due = self._settle_unrecorded(trainer, due, labeled)
        for milestone in due:
            path = self.folder(trainer) / self.file_name(milestone)
            # Recorded before saving, so that the file itself (and every later checkpoint) says it was saved.
            self.passed.add(milestone)
            self.paths[milestone] = str(path)
            trainer.save_checkpoint(path)
            rank_zero_info(f"MilestoneCheckpoint: {labeled} labeled query sets at step {trainer.global_step}: {path}")

    def _settle_unrecorded(self, trainer: pl.Trainer, due: list[int], labeled: int) -> list[int]:
        """After a resume from a checkpoint without this callback's record: no milestone is saved from weights that
        may be past it. Those with a file already count as saved; the others are given up, with a warning."""
        folder = self.folder(trainer)
        for milestone in due:
            self.passed.add(milestone)
            if (folder / self.file_name(milestone)).is_file():
                self.paths[milestone] = str(folder / self.file_name(milestone))
        given_up = [m for m in due if m not in self.paths]
        if given_up:
            rank_zero_warn(
                f"MilestoneCheckpoint: the run resumed from a checkpoint that holds no record of this callback and "
                f"had {labeled} labeled query sets after its first step; milestone(s) {given_up} have no file in "
                f"{folder} and may have been passed before the resume, so they are not saved (the weights may be "
                "past them). To have them, train a new run with the callback configured from the start."
            )
        return []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        missing = [m for m in self.milestones if m not in self.passed]
        if missing and not trainer.fast_dev_run:
            rank_zero_info(
                f"MilestoneCheckpoint: training ended at {self._labeled} labeled query sets, before milestone(s) "
                f"{missing}: no checkpoint for them"
            )

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        # Lightning calls this for every callback, then ``load_state_dict`` for those whose state the file holds.
        self._resumed_without_record = True

    def state_dict(self) -> dict[str, Any]:
        return {"passed": sorted(self.passed), "paths": {str(m): p for m, p in sorted(self.paths.items())}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed_without_record = False
        self.passed = {int(m) for m in state_dict.get("passed", [])}
        self.paths = {int(m): str(p) for m, p in state_dict.get("paths", {}).items()}

    def __repr__(self) -> str:
        return f"MilestoneCheckpoint(milestones={list(self.milestones)}, dirpath={self.dirpath!r})"

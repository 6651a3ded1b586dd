"""A command that trained nothing leaves no empty run behind: no W&B offline run folder, no run folder of configs
only; and a run's config file changes only when a command did something (``ConfigSnapshot``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger

from units_lightning.atomic import write_atomically
from units_lightning.cli.console import is_offline
from units_lightning.csv_history import METRICS, SEGMENTS
from units_lightning.runs import CHECKPOINTS, RESULTS, SUMMARY, run_directory

__all__ = ["ConfigSnapshot", "WandbFolderSnapshot", "discard_empty_run", "wandb_folder"]

# What makes a run folder worth keeping.
_KEPT = (CHECKPOINTS, SUMMARY, RESULTS, "predictions.csv", METRICS, SEGMENTS)


def wandb_folder(trainer: pl.Trainer) -> Path | None:
    """The ``wandb/`` folder the trainer's W&B logger writes its runs into (``<save_dir>/wandb``), or None without
    a W&B logger. Known before the W&B run is opened, so that a command can note what the folder held first."""
    logger = trainer.logger
    if not isinstance(logger, WandbLogger):
        return None
    experiment = getattr(logger, "_experiment", None)
    if experiment is not None:
        return Path(experiment.dir).parent.parent  # <wandb>/<run folder>/files
    root = os.environ.get("WANDB_DIR") or logger.save_dir or "."
    return Path(root) / "wandb"


class WandbFolderSnapshot:
    """What a ``wandb/`` folder held before a command: its run folders and where its links (``latest-run``,
    ``debug.log``, ``debug-internal.log``) pointed, so that a failed command's W&B run can be taken out again.

    Args:
        folder: the ``wandb/`` folder (``wandb_folder``), or None (no W&B logger).
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.existed = folder is not None and folder.is_dir()
        self.entries = {path.name for path in folder.iterdir()} if self.existed else set()
        self.links = {
            path.name: os.readlink(path) for path in (folder.iterdir() if self.existed else ()) if path.is_symlink()
        }

    def remove_run(self, offline: Path) -> None:
        """Remove the run folder ``offline`` unless it was there before, point the links back where they pointed
        and remove the ``wandb/`` folder itself where the command made it and it is now empty."""
        parent = offline.parent
        if offline.name not in self.entries:
            shutil.rmtree(offline, ignore_errors=True)
        noted = parent == self.folder  # elsewhere, remove only what is certainly this command's: dangling links
        for link in parent.iterdir() if parent.is_dir() else ():
            if not link.is_symlink():
                continue
            if noted and link.name in self.links:
                if os.readlink(link) != self.links[link.name]:
                    link.unlink(missing_ok=True)
                    link.symlink_to(self.links[link.name])
            elif not link.exists():
                link.unlink(missing_ok=True)
        if noted and not self.existed:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty


def discard_empty_run(
    trainer: pl.Trainer, start_step: int = 0, command: str = "fit", wandb_before: WandbFolderSnapshot | None = None
) -> None:
    """After a failed command (or a resume with nothing to train): remove the W&B offline run folder this command
    opened and the run folder it made, unless it trained (a ``fit`` past ``start_step``) or the run folder holds a
    checkpoint, a summary, metrics or results.

    ``validate``, ``test`` and ``predict`` train nothing: a failed one leaves nothing, whatever step its checkpoint
    holds (one that fails before the checkpoint is restored is at step 0).

    Args:
        trainer: the command's trainer.
        start_step: the step the command started from (a resumed ``fit``'s checkpoint); steps done since keep all.
        command: the subcommand (``fit``, ``validate``, ``test``, ``predict``).
        wandb_before: the ``wandb/`` folder as it was before the command (``WandbFolderSnapshot``); without it
            the run folder is removed unless its name was there before, and dangling links with it.
    """
    if command == "fit" and trainer.global_step > start_step:
        return  # steps were done: their logs and checkpoints stay, for --ckpt_path last
    logger = trainer.logger
    folder = run_directory(trainer)
    experiment = getattr(logger, "_experiment", None) if isinstance(logger, WandbLogger) else None
    if experiment is not None and is_offline(experiment):
        offline = Path(experiment.dir).parent
        with contextlib.suppress(Exception):
            experiment.finish(exit_code=1)
        (wandb_before or WandbFolderSnapshot(None)).remove_run(offline)
    if folder.is_dir() and not any((folder / name).exists() for name in _KEPT) and folder != Path.cwd():
        leftovers = [p for p in folder.iterdir() if not p.name.startswith("config") and p.name != "hparams.yaml"]
        if not leftovers and folder.resolve() != Path(trainer.default_root_dir).resolve():
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # the logger's name folder, if this run was its only one


class ConfigSnapshot:
    """A run's config file (``config.yaml``, ``config_test.yaml``, ...) as it was before a command, so that the
    command leaves it as it was unless it did something.

    ``SaveRunConfig`` writes the command's config at the start of the run, before it is known whether the command
    trains or evaluates anything: ``restore`` puts back the file as it was (removes it where there was none) after a
    command that failed or had nothing to train; ``keep_previous`` keeps the replaced one beside the new, as
    ``config.<n>.yaml`` (the first free ``n``), after a resumed run that went on with another config.

    Args:
        paths: the config files the command may write (one per folder it may write into).
    """

    def __init__(self, paths: list[Path]) -> None:
        self.before = {path: path.read_bytes() if path.is_file() else None for path in dict.fromkeys(paths)}

    def restore(self) -> None:
        for path, content in self.before.items():
            if content is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != content:
                write_atomically(path, lambda file, content=content: file.write(content))

    def keep_previous(self) -> None:
        for path, content in self.before.items():
            if content is None or not path.is_file() or path.read_bytes() == content:
                continue
            number = 1
            while (kept := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
                number += 1
            write_atomically(kept, lambda file, content=content: file.write(content))

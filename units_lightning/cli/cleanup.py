"""A command that trained nothing leaves no empty run behind: no W&B offline run folder, no run folder of configs
only; and a run's config file changes only when a command did something (``ConfigSnapshot``)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger

from units_lightning.cli.console import is_offline
from units_lightning.csv_history import METRICS, SEGMENTS
from units_lightning.runs import CHECKPOINTS, RESULTS, SUMMARY, run_directory

__all__ = ["ConfigSnapshot", "discard_empty_run"]

# What makes a run folder worth keeping.
_KEPT = (CHECKPOINTS, SUMMARY, RESULTS, "predictions.csv", METRICS, SEGMENTS)


def discard_empty_run(trainer: pl.Trainer, start_step: int = 0) -> None:
    """After a failure before the first step (or a resume with nothing to train): remove the W&B offline run
    folder this command opened and the run folder it made, unless they hold a checkpoint, a summary, metrics or
    results.

    Args:
        trainer: the command's trainer.
        start_step: the step the command started from (a resumed ``fit``'s checkpoint); steps done since keep all.
    """
    if trainer.global_step != start_step:
        return  # steps were done: their logs and checkpoints stay, for --ckpt_path last
    logger = trainer.logger
    folder = run_directory(trainer)
    experiment = getattr(logger, "_experiment", None) if isinstance(logger, WandbLogger) else None
    if experiment is not None and is_offline(experiment):
        offline = Path(experiment.dir).parent
        with contextlib.suppress(Exception):
            experiment.finish(exit_code=1)
        shutil.rmtree(offline, ignore_errors=True)
        for link in offline.parent.iterdir() if offline.parent.is_dir() else ():
            if link.is_symlink() and not link.exists():  # latest-run, debug.log: pointed into the removed run
                link.unlink(missing_ok=True)
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
                path.write_bytes(content)

    def keep_previous(self) -> None:
        for path, content in self.before.items():
            if content is None or not path.is_file() or path.read_bytes() == content:
                continue
            number = 1
            while (kept := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
                number += 1
            kept.write_bytes(content)

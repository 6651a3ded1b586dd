"""A run's folder: one per run, holding its checkpoints, config, summary, test results, predictions and report.

It is the folder Lightning's ``ModelCheckpoint`` puts ``checkpoints/`` in, whatever the logger:

- with a logger, ``<save_dir>/<name>/<version>``: ``runs/quickstart/units-lightning/<W&B run id>`` for the
  quick start (the W&B project is the logger's name), ``<save_dir>/lightning_logs/version_<N>`` for ``CSVLogger``
  and ``TensorBoardLogger``;
- without one, ``default_root_dir``.

``test``, ``validate`` and ``predict`` of a checkpoint that lies in a run folder (``<run>/checkpoints/*.ckpt``)
under the command's own root (its logger's ``save_dir``, or ``default_root_dir`` without a logger) write into that
run's folder, beside its ``summary.json``; a command given another root writes into its own run folder there.
``find_run_folders`` finds the run folders under a folder again (``units-lightning report``); nothing here
imports Lightning, so the report starts fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "CHECKPOINTS",
    "CONFIG",
    "REPORT",
    "RESULTS",
    "SUMMARY",
    "checkpoint_run_folder",
    "config_file_name",
    "find_run_folders",
    "is_run_folder",
    "logger_run_folder",
    "run_directory",
]

CHECKPOINTS = "checkpoints"  # ModelCheckpoint's folder inside a run folder
SUMMARY = "summary.json"  # written by `fit`
CONFIG = "config.yaml"  # the resolved config of `fit`; other commands write config_<command>.yaml
RESULTS = "results.json"  # written by `test`
REPORT = "report"  # `units-lightning report`: report.html and the PNGs
_EVALUATION_STAGES = ("validate", "test", "predict")
_NOT_RUNS = ("wandb", REPORT, CHECKPOINTS, "__pycache__")  # folders that never hold a run folder


def config_file_name(command: str) -> str:
    """``config.yaml`` for ``fit``, ``config_<command>.yaml`` for the commands that evaluate a checkpoint (so a
    ``test`` in a run's folder does not overwrite the config the run was trained with)."""
    return CONFIG if command == "fit" else f"config_{command}.yaml"


def checkpoint_run_folder(ckpt_path: str | os.PathLike | None) -> Path | None:
    """The run folder of a checkpoint file ``<run>/checkpoints/<file>.ckpt``, or None for a file elsewhere."""
    if ckpt_path is None:
        return None
    path = Path(ckpt_path)
    if path.parent.name != CHECKPOINTS or not path.is_file():
        return None
    return path.parent.parent


def logger_run_folder(logger: Any, default_root_dir: str | os.PathLike) -> Path:
    """Where ``ModelCheckpoint`` puts ``checkpoints/`` for this logger (its own rule), without ``checkpoints/``.

    Args:
        logger: the trainer's first logger, or None.
        default_root_dir: the trainer's ``default_root_dir``.
    """
    if logger is None:
        return Path(default_root_dir)
    save_dir = logger.save_dir if logger.save_dir is not None else default_root_dir
    version = logger.version
    return Path(save_dir) / str(logger.name) / (version if isinstance(version, str) else f"version_{version}")


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def run_directory(trainer: pl.Trainer) -> Path:
    """The folder of the trainer's run (see the module docstring). Broadcasts nothing: rank zero alone may call it.

    ``fit`` writes into its logger's run folder; ``validate``, ``test`` and ``predict`` into the run folder of the
    checkpoint they load when it has one under the command's root, else into their logger's.
    """
    logger = trainer.loggers[0] if trainer.loggers else None
    own = logger_run_folder(logger, trainer.default_root_dir)
    stage = getattr(getattr(trainer.state, "fn", None), "value", None)
    if stage in _EVALUATION_STAGES:
        folder = checkpoint_run_folder(trainer.ckpt_path)
        root = Path(logger.save_dir if logger is not None and logger.save_dir is not None else trainer.default_root_dir)
        if folder is not None and _inside(folder, root):
            return folder
    return own


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run folder: it holds ``checkpoints/``, ``summary.json`` or ``results.json``."""
    path = Path(path)
    return (path / CHECKPOINTS).is_dir() or (path / SUMMARY).is_file() or (path / RESULTS).is_file()


def _walk(folder: Path, depth: int) -> Iterator[Path]:
    if is_run_folder(folder):
        yield folder
    if depth == 0:
        return
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return
    for child in children:
        if child.name not in _NOT_RUNS and not child.name.startswith("."):
            yield from _walk(child, depth - 1)


def find_run_folders(root: str | os.PathLike, depth: int = 4) -> list[Path]:
    """The run folders at or below ``root`` (at most ``depth`` levels down), in path order.

    ``runs/quickstart`` gives ``runs/quickstart/units-lightning/<run id>`` for each W&B run of the quick start;
    W&B's own ``wandb/`` folder, ``report/`` and ``checkpoints/`` are not searched.
    """
    root = Path(root)
    return list(_walk(root, depth)) if root.is_dir() else []

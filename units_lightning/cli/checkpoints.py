"""``--ckpt_path last`` / ``best`` and the run a command continues, and which model options a checkpoint replaced.

``resolve_ckpt_path`` finds the checkpoint a config's runs left (``units_lightning.resume``) and gives the new
logger the run it continues; ``checkpoint_overrides`` and ``overrides_report`` say which configured model options
LightningCLI replaced with those saved in the checkpoint.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from units_lightning.cli.checkpoint_files import checkpoint_problem
from units_lightning.cli.config_sources import class_defaults
from units_lightning.resume import best_checkpoint, find_last_checkpoint, stored_run
from units_lightning.runs import CHECKPOINTS

__all__ = ["checkpoint_overrides", "configured_logger", "overrides_report", "resolve_ckpt_path", "settle_save_dir"]


def configured_logger(config: Namespace) -> Any:
    """The (first) logger of a subcommand's config: a ``Namespace`` with ``class_path``, ``False`` or ``None``."""
    logger = config.trainer.get("logger")
    return logger[0] if isinstance(logger, list) and logger else logger


def settle_save_dir(config: Namespace) -> None:
    """A ``WandbLogger`` given no folder (``save_dir`` ``.``, its default, and no ``dir``) writes under
    ``trainer.default_root_dir``, as Lightning's own default logger does: one option moves a whole run."""
    logger = configured_logger(config)
    root = config.trainer.get("default_root_dir")
    init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
    if init_args is None or root is None or not str(logger.get("class_path")).endswith("WandbLogger"):
        return
    if init_args.get("save_dir") in (None, ".") and init_args.get("dir") is None:
        init_args.save_dir = str(root)


def _checkpoint_folders(config: Namespace) -> list[str]:
    """Where the runs of ``config`` keep their checkpoints, as ``ModelCheckpoint`` resolves its ``dirpath``:
    the configured ``dirpath``, else ``<logger save_dir>/<name>/<version>/checkpoints`` (any name and version),
    else ``<default_root_dir>/checkpoints`` without a logger."""
    trainer = config.trainer
    root = trainer.get("default_root_dir") or os.getcwd()
    folders = []
    callbacks = trainer.get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        init_args = callback.get("init_args") if isinstance(callback, Namespace) else None
        if init_args is not None and "ModelCheckpoint" in str(callback.get("class_path")) and init_args.get("dirpath"):
            folders.append(str(init_args.dirpath))
    logger = configured_logger(config)
    if logger is False or logger == []:
        folders.append(os.path.join(root, CHECKPOINTS))
    else:
        init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
        save_dir = (init_args.get("save_dir") or init_args.get("dir")) if init_args is not None else None
        folders.append(os.path.join(glob.escape(str(save_dir or root)), "*", "*", CHECKPOINTS))
    return folders


def resolve_ckpt_path(config: Namespace, subcommand: str) -> int | None:
    """``ckpt_path: last`` becomes the newest ``last.ckpt`` of the config's runs (``None``, a new run, where there is
    none, for ``fit``); ``ckpt_path: best`` the best checkpoint by ``val/acc`` of that same run.

    ``fit``, ``validate`` and ``test`` from a checkpoint file continue its W&B run: the logger gets the run id
    stored in the checkpoint (``resume="allow"``), so the history (and the test results) go on in the same W&B run
    and the files in its folder. A resumed ``fit`` continues a ``CSVLogger`` / ``TensorBoardLogger`` version too.

    Returns:
        The global step stored in the checkpoint, or None without one.

    Raises:
        ValueError: if ``best`` names no checkpoint, ``last``/``best`` finds none for a command that needs one, or
            the checkpoint cannot be read.
    """
    given = config.get("ckpt_path")
    if given in ("last", "best"):
        folders = _checkpoint_folders(config)
        last = find_last_checkpoint(folders)
        path = last if given == "last" or last is None else best_checkpoint(last)
        if path is None:
            where = " or ".join(folders)
            if given == "last" and subcommand == "fit":
                config.ckpt_path = None
                if rank_zero_only.rank == 0:
                    print(f"--ckpt_path last: no last.ckpt in {where}; starting a new run.", flush=True)
                return None
            raise ValueError(
                f"--ckpt_path {given}: no {'checkpoint' if last is None else 'best checkpoint recorded'} in "
                f"{where}. Train one with `units-lightning fit` and the same --config (and "
                "--trainer.default_root_dir), or pass --ckpt_path <a checkpoint file>."
            )
        config.ckpt_path = str(path)
    elif given and os.path.isfile(given):
        path = given
    else:
        return None
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"--ckpt_path {given}: {path} {problem}.")
    try:
        run = stored_run(path)
    except Exception as error:  # e.g. cut short by a writer that was not atomic
        raise ValueError(
            f"--ckpt_path {given}: {path} cannot be read ({error}). Move it away (with `last`, the newest before it "
            "is used), or pass --ckpt_path <another checkpoint file>."
        ) from error
    logger = configured_logger(config)
    init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
    continued = ""
    if subcommand != "predict" and init_args is not None and run["version"] is not None:
        logger_class = str(logger.get("class_path")).rsplit(".", 1)[-1]
        key = "id" if logger_class == "WandbLogger" else "version"
        same = run["logger"] in (None, logger_class) and init_args.get("id") is None
        if same and init_args.get("version") is None and (subcommand == "fit" or key == "id"):
            init_args[key] = run["version"]
            if key == "id" and "resume" in init_args and init_args.resume is None:
                init_args.resume = "allow"  # the CLI passes resume=None, which would start a new run of that id
            continued = f", continuing {'W&B run' if key == 'id' else logger_class + ' version'} {run['version']}"
    if rank_zero_only.rank == 0:
        verb = "resuming from" if subcommand == "fit" else "using"
        print(f"--ckpt_path {given}: {verb} {path} (step {run['global_step']}{continued}).", flush=True)
    return run["global_step"]


def _show(value: Any) -> str:
    if isinstance(value, dict) and "class_path" in value:
        args = ", ".join(f"{k}={v!r}" for k, v in (value.get("init_args") or {}).items())
        return f"{value['class_path']}({args})"
    return repr(value)


def checkpoint_overrides(given: dict[str, Any], restored: dict[str, Any], prefix: str = "model") -> list[tuple]:
    """``(option, given value, checkpoint value)`` for every model option that a checkpoint's saved
    hyperparameters replaced (LightningCLI applies them over the configuration when ``ckpt_path`` is a file).

    Options absent from ``given`` (``n_way`` and ``image_shape``, linked from the data) are not compared; inside a
    class given by ``class_path`` an argument the configuration left out counts as its default.
    """
    changed = []
    for key, value in restored.items():
        if key not in given:
            continue
        option, before = f"{prefix}.{key}", given[key]
        same_class = (
            isinstance(before, dict)
            and isinstance(value, dict)
            and before.get("class_path") is not None
            and before.get("class_path") == value.get("class_path")
        )
        if same_class:
            defaults = class_defaults(before["class_path"])
            before_args = {**defaults, **(before.get("init_args") or {})}
            changed += checkpoint_overrides(before_args, value.get("init_args") or {}, option)
        elif before != value:
            changed.append((option, before, value))
    return changed


def overrides_report(ckpt_path: str, changed: list[tuple]) -> str:
    """What ``--ckpt_path`` says when the checkpoint's saved model options replaced configured ones (``changed``
    from ``checkpoint_overrides``)."""
    rows = "\n".join(f"  {option}: given {_show(a)}, checkpoint {_show(b)}" for option, a, b in changed)
    return (
        f"--ckpt_path {ckpt_path}: the model options saved in the checkpoint replace the configured ones "
        f"(LightningCLI restores them with the weights):\n{rows}\n"
        "The checkpoint's values are used. To run with the given ones, train a checkpoint with them; options "
        "that keep the weights' shapes can be set from Python instead: "
        "e.g. UnitsMAML.load_from_checkpoint(path, eval_inner_steps=10)"
    )

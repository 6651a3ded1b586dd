"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules."""

from __future__ import annotations

import copy
import glob
import importlib
import inspect
import json
import math
import os
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from units_lightning import keys
from units_lightning.callbacks import CollapseMonitor, SaveRunConfig, dashboard_callbacks
from units_lightning.callbacks.prediction_writer import PredictionWriter
from units_lightning.callbacks.run_version import RecordRunVersion
from units_lightning.dashboard.report import main as report_main
from units_lightning.dashboard.workspace import main as dashboard_main
from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.module import UnitsMAML
from units_lightning.resume import AtomicCheckpointIO, find_last_checkpoint, stored_run
from units_lightning.runs import run_directory

__all__ = ["UnitsCLI", "cli_main", "fit_summary", "main"]

_SUMMARY_KEYS = {
    "val_accuracy": keys.stage_key(keys.VAL, keys.ACC),
    **{f"val_{name}": keys.stage_key(keys.VAL, name) for name in keys.BELIEFS},
}


def fit_summary(trainer: pl.Trainer, model: UnitsMAML, wall_time_s: float) -> dict[str, Any]:
    """Final validation metrics, labels spent, steps and wall time of a finished ``fit``; why it stopped when the
    label budget ended it, the steps skipped as non-finite, and the ``CollapseMonitor`` warning if one was given."""
    metrics = trainer.callback_metrics
    summary: dict[str, Any] = {}
    for name, key in _SUMMARY_KEYS.items():
        value = float(metrics[key]) if key in metrics else math.nan
        summary[name] = None if math.isnan(value) else round(value, 6)
    summary.update(
        labels=model.ledger.state_dict(),
        steps=int(trainer.global_step),
        wall_time_s=round(wall_time_s, 2),
        chance_accuracy=round(1.0 / model.n_way, 6),
    )
    ledger = model.ledger
    warnings = [c.warning for c in trainer.callbacks if isinstance(c, CollapseMonitor) and c.warning]
    summary.update(
        stopped=f"label budget of {ledger.budget} query sets reached" if ledger.exhausted else None,
        skipped_steps=ledger.skipped_steps,
        collapse_warning=warnings[0] if warnings else None,
    )
    return summary


def _format(summary: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    labels = summary["labels"]
    lines = [
        "units-lightning fit summary",
        f"  validation accuracy  {pct(summary['val_accuracy'])} (chance {pct(summary['chance_accuracy'])})",
        f"  vacuity {num(summary['val_vacuity'])} | dissonance {num(summary['val_dissonance'])} | "
        f"incorrect belief {num(summary['val_incorrect_belief'])} | "
        f"correct belief {num(summary['val_correct_belief'])}",
        f"  labels spent         {labels['query_sets']} query sets, {labels['query_images']} query images, "
        f"{labels['support_images']} support images",
        f"  steps {summary['steps']} in {summary['wall_time_s']:.1f} s",
    ]
    if summary.get("stopped"):
        lines.append(f"  stopped: {summary['stopped']}")
    if summary.get("skipped_steps"):
        lines.append(
            f"  skipped steps        {summary['skipped_steps']} (non-finite loss or gradients, not applied; their "
            f"{labels.get('skipped_query_sets', 0)} labeled query sets are counted above)"
        )
    if summary.get("collapse_warning"):
        lines.append(f"  warning: {summary['collapse_warning']}")
    return "\n".join(lines)


def _configured_logger(config: Namespace) -> Any:
    """The (first) logger of a subcommand's config: a ``Namespace`` with ``class_path``, ``False`` or ``None``."""
    logger = config.trainer.get("logger")
    return logger[0] if isinstance(logger, list) and logger else logger


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
    logger = _configured_logger(config)
    if logger is False or logger == []:
        folders.append(os.path.join(root, "checkpoints"))
    else:
        init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
        save_dir = (init_args.get("save_dir") or init_args.get("dir")) if init_args is not None else None
        folders.append(os.path.join(glob.escape(str(save_dir or root)), "*", "*", "checkpoints"))
    return folders


def _resolve_ckpt_path(config: Namespace, subcommand: str) -> None:
    """``ckpt_path: last`` becomes the newest ``last.ckpt`` of the config's runs (``None``, a new run, where there is
    none). ``fit`` from a checkpoint file continues its run: the logger gets the run version stored in it (the W&B
    run id, with ``resume="allow"``), so the history goes on in the same W&B run and the checkpoints in its folder."""
    given = config.get("ckpt_path")
    if given == "last":
        folders = _checkpoint_folders(config)
        path = find_last_checkpoint(folders)
        if path is None:
            config.ckpt_path = None
            if rank_zero_only.rank == 0:
                print(f"--ckpt_path last: no last.ckpt in {' or '.join(folders)}; starting a new run.", flush=True)
            return
        config.ckpt_path = str(path)
    elif subcommand == "fit" and given and os.path.isfile(given):
        path = given
    else:
        return
    try:
        run = stored_run(path)
    except Exception as error:  # e.g. cut short by a writer that was not atomic
        raise RuntimeError(
            f"--ckpt_path {given}: {path} cannot be read ({error}). Move it away (with `last`, the newest before it "
            "is used), or pass --ckpt_path <another checkpoint file>."
        ) from error
    logger = _configured_logger(config)
    init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
    continued = ""
    if subcommand == "fit" and init_args is not None and run["version"] is not None:
        logger_class = str(logger.get("class_path")).rsplit(".", 1)[-1]
        key = "id" if logger_class == "WandbLogger" else "version"
        if run["logger"] in (None, logger_class) and init_args.get("id") is None and init_args.get("version") is None:
            init_args[key] = run["version"]
            if key == "id" and "resume" in init_args and init_args.resume is None:
                init_args.resume = "allow"  # the CLI passes resume=None, which would start a new run of that id
            continued = f", continuing {'W&B run' if key == 'id' else logger_class + ' version'} {run['version']}"
    if rank_zero_only.rank == 0:
        verb = "resuming from" if subcommand == "fit" else "using"
        print(f"--ckpt_path {given}: {verb} {path} (step {run['global_step']}{continued}).", flush=True)


def _class_defaults(class_path: str) -> dict[str, Any]:
    """The ``__init__`` defaults of ``class_path`` (empty when it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _show(value: Any) -> str:
    if isinstance(value, dict) and "class_path" in value:
        args = ", ".join(f"{k}={v!r}" for k, v in (value.get("init_args") or {}).items())
        return f"{value['class_path']}({args})"
    return repr(value)


def _checkpoint_overrides(given: dict[str, Any], restored: dict[str, Any], prefix: str = "model") -> list[tuple]:
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
            defaults = _class_defaults(before["class_path"])
            before_args = {**defaults, **(before.get("init_args") or {})}
            changed += _checkpoint_overrides(before_args, value.get("init_args") or {}, option)
        elif before != value:
            changed.append((option, before, value))
    return changed


class UnitsCLI(LightningCLI):
    """LightningCLI with the data module's task shape and sampler linked into the model, the dashboard callbacks
    added to the trainer's (``--dashboard_callbacks false`` leaves them out) and a summary after ``fit``.

    ``test`` writes ``results.json`` through the module's ``ResultsWriter`` callback, as ``trainer.test`` does.
    """

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.n_way", "model.n_way", apply_on="instantiate")
        parser.link_arguments("data.image_shape", "model.image_shape", apply_on="instantiate")
        # One sampler draws the candidate tasks (data side) and chooses among them (model side).
        parser.link_arguments("data.sampler", "model.sampler", apply_on="instantiate")
        # Inert outside `predict`; there it writes predictions.csv/json (--prediction.threshold sets abstention).
        parser.add_lightning_class_args(PredictionWriter, "prediction")
        # A warning when training sits at chance with vacuity near 0 or 1 (--collapse.window 0 switches it off).
        parser.add_lightning_class_args(CollapseMonitor, "collapse")
        parser.add_argument(
            "--dashboard_callbacks",
            type=bool,
            default=True,
            help="Add the belief-dashboard callbacks (units_lightning.callbacks.dashboard_callbacks()) to "
            "trainer.callbacks; false leaves them out.",
        )

    def _parse_ckpt_path(self) -> None:
        """LightningCLI replaces the model options with those saved in a ``--ckpt_path`` file: say which changed."""
        subcommand = self.config.get("subcommand")
        model = self.config[subcommand].get("model") if subcommand else None
        given = copy.deepcopy(model.as_dict()) if isinstance(model, Namespace) else None
        super()._parse_ckpt_path()
        if given is None or rank_zero_only.rank != 0:
            return
        changed = _checkpoint_overrides(given, self.config[subcommand]["model"].as_dict())
        if changed:
            rows = "\n".join(f"  {option}: given {_show(a)}, checkpoint {_show(b)}" for option, a, b in changed)
            print(
                f"--ckpt_path {self.config[subcommand]['ckpt_path']}: the model options saved in the checkpoint "
                f"replace the configured ones (LightningCLI restores them with the weights):\n{rows}\n"
                "The checkpoint's values are used. To run with the given ones, train a checkpoint with them; options "
                "that keep the weights' shapes can be set from Python instead: "
                "e.g. UnitsMAML.load_from_checkpoint(path, eval_inner_steps=10)",
                file=sys.stderr,
                flush=True,
            )

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # `--ckpt_path last` (the newest last.ckpt of this config's runs) and the run a resumed `fit` continues,
        # settled before LightningCLI reads the checkpoint's hyperparameters.
        subcommand = self.config.get("subcommand")
        if subcommand:
            _resolve_ckpt_path(self.config[subcommand], subcommand)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        # Resume: every checkpoint names the logger run that wrote it (a `fit` resumed from it continues that run).
        added = [*(dashboard_callbacks() if config.get("dashboard_callbacks", True) else []), RecordRunVersion()]
        # LightningCLI appends trainer_defaults["callbacks"] to the configured trainer.callbacks.
        existing = self.trainer_defaults.get("callbacks", [])
        existing = list(existing) if isinstance(existing, list) else [existing]
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": [*existing, *added]}

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()
        if type(self.trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the config chose
            self.trainer.strategy.checkpoint_io = AtomicCheckpointIO()

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        summary = fit_summary(self.trainer, self.model, time.perf_counter() - self._fit_started)
        directory = run_directory(self.trainer)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "summary.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
        if isinstance(self.trainer.logger, WandbLogger):
            self.trainer.logger.experiment.summary.update(
                {f"summary/{k}": v for k, v in summary.items() if not isinstance(v, dict)}
            )
        print(_format(summary) + f"\n  written to {path}", flush=True)


def cli_main(args: list[str] | None = None, run: bool = True) -> UnitsCLI:
    """Entry point of ``units-lightning`` and ``python -m units_lightning``.

    With ``run=False`` the arguments name no subcommand and the CLI only builds ``cli.trainer``, ``cli.model``
    and ``cli.datamodule`` from them (``benchmarks/fit.py`` uses this to time a real run).
    """
    return UnitsCLI(
        UnitsMAML,
        EpisodicDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"inference_mode": False},
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (returns nothing, so the exit status is 0 on success).

    ``dashboard`` and ``report`` are this package's own commands; everything else (``fit``, ``validate``,
    ``test``, ``predict``, ``--help``) goes to LightningCLI.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0] == "dashboard":
        return dashboard_main(words[1:])
    if words and words[0] == "report":
        return report_main(words[1:])
    try:
        cli_main(None if argv is None else words)  # None: LightningCLI reads sys.argv itself
    except SIGTERMException:  # Lightning stops at the next step boundary, then exits with status 0: say 143
        print(
            "units-lightning: stopped by SIGTERM; continue with the same command and --ckpt_path last",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signal.SIGTERM)

"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules, plus the
package's own commands (``report``, ``dashboard``, ``select``, ``ingest``).

What a person sees: one line per validation (``--progress steps`` for Lightning's bar), a summary that lists every
file written, and bad input as one paragraph without a traceback (``--debug`` or ``UNITS_LIGHTNING_DEBUG=1``
shows it). Every run has one folder (``units_lightning.runs``) that ``test``, ``report`` and ``--ckpt_path
last`` / ``best`` find again.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from units_lightning import errors
from units_lightning.callbacks import CollapseMonitor, SaveRunConfig, dashboard_callbacks
from units_lightning.callbacks.prediction_writer import PredictionWriter
from units_lightning.callbacks.progress import ValidationProgress
from units_lightning.callbacks.run_version import RecordRunVersion
from units_lightning.cli_parser import LIGHTNING_COMMANDS, UnitsArgumentParser
from units_lightning.config_sources import class_defaults, inherited_arguments, reset_inherited
from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.module import UnitsMAML
from units_lightning.resume import AtomicCheckpointIO, best_checkpoint, find_last_checkpoint, stored_run
from units_lightning.runs import CHECKPOINTS, SUMMARY, config_file_name, run_directory
from units_lightning.summary import fit_summary, format_summary, is_offline, written_files

__all__ = ["COMMANDS", "UnitsCLI", "cli_main", "fit_summary", "main"]

COMMANDS = {
    "fit": "train a model (--config configs/quickstart.yaml); --ckpt_path last continues a stopped run",
    "validate": "evaluate a checkpoint on the validation tasks",
    "test": "evaluate a checkpoint on the test tasks: results.json, plots, out-of-distribution probes",
    "predict": "classify your own images with a checkpoint: predictions.csv, with vacuity and abstentions",
    "report": "draw a run's dashboard offline (report.html and PNGs); several runs side by side",
    "dashboard": "save the belief dashboard as a W&B workspace (--dry-run prints it, no account needed)",
    "select": "choose the unlabeled images of an annotation project most worth labeling next",
    "ingest": "read finished annotations back into an annotation project's labels",
}
# Options that decide where a config's runs are (for the next command `fit` suggests).
_WHERE_OPTIONS = (
    "--config",
    "-c",
    "--trainer.default_root_dir",
    "--trainer.logger.save_dir",
    "--trainer.logger.init_args.save_dir",
)
PROGRESS_MODES = ("validation", "steps")
# Noise for a reader, hidden unless --progress steps: the data is decoded in memory, so loader workers would not
# help; a deprecation inside Lightning itself; and, for `predict` (no logger, no checkpointing), Lightning's notes
# that the checkpoint callbacks' folder moved and that a list of batches has no sampler indices.
_QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*isinstance.treespec, LeafSpec.*",
    r".*The dirpath has changed from.*",
    r".*Couldn't infer the batch indices fetched from your dataloader.*",
)
_QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric")


def _configured_logger(config: Namespace) -> Any:
    """The (first) logger of a subcommand's config: a ``Namespace`` with ``class_path``, ``False`` or ``None``."""
    logger = config.trainer.get("logger")
    return logger[0] if isinstance(logger, list) and logger else logger


def _settle_save_dir(config: Namespace) -> None:
    """A ``WandbLogger`` given no folder (``save_dir`` ``.``, its default, and no ``dir``) writes under
    ``trainer.default_root_dir``, as Lightning's own default logger does: one option moves a whole run."""
    logger = _configured_logger(config)
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
    logger = _configured_logger(config)
    if logger is False or logger == []:
        folders.append(os.path.join(root, CHECKPOINTS))
    else:
        init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
        save_dir = (init_args.get("save_dir") or init_args.get("dir")) if init_args is not None else None
        folders.append(os.path.join(glob.escape(str(save_dir or root)), "*", "*", CHECKPOINTS))
    return folders


def _resolve_ckpt_path(config: Namespace, subcommand: str) -> int | None:
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
    try:
        run = stored_run(path)
    except Exception as error:  # e.g. cut short by a writer that was not atomic
        raise ValueError(
            f"--ckpt_path {given}: {path} cannot be read ({error}). Move it away (with `last`, the newest before it "
            "is used), or pass --ckpt_path <another checkpoint file>."
        ) from error
    logger = _configured_logger(config)
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
            defaults = class_defaults(before["class_path"])
            before_args = {**defaults, **(before.get("init_args") or {})}
            changed += _checkpoint_overrides(before_args, value.get("init_args") or {}, option)
        elif before != value:
            changed.append((option, before, value))
    return changed


class UnitsCLI(LightningCLI):
    """LightningCLI with the data module's task shape and sampler linked into the model, the dashboard callbacks
    added to the trainer's (``--dashboard_callbacks false`` leaves them out), a quiet progress display
    (``--progress``) and a summary after ``fit`` that lists the files written.

    ``test`` writes ``results.json`` through the module's ``ResultsWriter`` callback, as ``trainer.test`` does, into
    the folder of the run whose checkpoint it evaluates. A command that fails before its first step leaves no W&B
    run folder behind.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._output = contextlib.ExitStack()  # quiet logging and warnings, undone when the command ends
        self._restored_step: int | None = None
        self._command_args: list[str] = []
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._output.close()

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
        parser.add_argument(
            "--progress",
            type=str,
            choices=PROGRESS_MODES,
            default="validation",
            help="validation: one line per validation with the accuracy and beliefs (Lightning's and W&B's "
            "notices hidden); steps: Lightning's progress bar, redrawn at every step, and every notice.",
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
        words = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict | Namespace) else []
        subcommand = next((word for word in words if word in LIGHTNING_COMMANDS), None)
        self._command_args = words[words.index(subcommand) + 1 :] if subcommand else words
        if isinstance(parser, UnitsArgumentParser):
            parser.before_print = lambda cfg: (
                self._settle_classes(cfg[cfg.subcommand]) if cfg.get("subcommand") else None
            )
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if not subcommand:  # run=False (benchmarks/fit.py): the trainer is built, not run
            self._settle_classes(self.config)
            return
        config = self.config[subcommand]
        if config.get("progress", "validation") == "validation":
            self._quiet()
            if subcommand == "test" and "--verbose" not in self._command_args:
                config.verbose = False  # ResultsWriter prints the results; Lightning's table repeats 60 numbers
        self._settle_classes(config)
        # `--ckpt_path last` / `best` and the run a resumed `fit` (or a `test`) continues, settled before
        # LightningCLI reads the checkpoint's hyperparameters.
        self._restored_step = _resolve_ckpt_path(config, subcommand)
        quiet = config.get("progress", "validation") == "validation"
        if self._restored_step is not None and subcommand == "fit" and quiet:
            # A resumed run writes on into its own checkpoint folder: Lightning's notice that the folder "exists and
            # is not empty" says nothing here (undone with the other filters of `_quiet` when the command ends).
            warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")

    def _settle_classes(self, config: Namespace) -> None:
        """A class named by a later config file starts from its own defaults (jsonargparse would carry over the
        arguments of the class it replaces that the new one also accepts); say which values that concerns. The
        W&B logger writes under ``default_root_dir`` unless given a folder."""
        inherited = inherited_arguments(self._command_args, config)
        reset_inherited(config, inherited)
        if inherited and rank_zero_only.rank == 0:
            print("\n".join(item.describe() for item in inherited), file=sys.stderr, flush=True)
        _settle_save_dir(config)

    def _quiet(self) -> None:
        """Hide what a reader of one line per validation does not need: Lightning's notices (GPU/TPU lines, the
        seed, the model summary, tips), W&B's banner, and two warnings that are noise here."""
        for name in _QUIET_LOGGERS:
            logger = logging.getLogger(name)
            level = logger.level
            logger.setLevel(logging.WARNING)
            self._output.callback(logger.setLevel, level)
        self._output.enter_context(warnings.catch_warnings())
        for message in _QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        if "WANDB_SILENT" not in os.environ:
            os.environ["WANDB_SILENT"] = "true"
            self._output.callback(os.environ.pop, "WANDB_SILENT", None)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        # Resume: every checkpoint names the logger run that wrote it (a `fit` resumed from it continues that run).
        added = [*(dashboard_callbacks() if config.get("dashboard_callbacks", True) else []), RecordRunVersion()]
        if self._wants_progress(config):
            added.append(ValidationProgress())
        # LightningCLI appends trainer_defaults["callbacks"] to the configured trainer.callbacks.
        existing = self.trainer_defaults.get("callbacks", [])
        existing = list(existing) if isinstance(existing, list) else [existing]
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": [*existing, *added]}
        if self.subcommand:
            # config.yaml is the training config; `test` in the same run folder writes config_test.yaml beside it.
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": config_file_name(self.subcommand)}
        if self.subcommand == "predict":
            config.trainer.logger = False  # predict logs nothing: no empty logger run; files go to the run folder

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        # Lightning's WandbLogger passes `anonymous=None` to wandb.init, which wandb (0.2x on) answers with "The
        # anonymous setting has no effect and will be removed" on every command: leave out an option that asks for
        # nothing. One given in the config (`anonymous: true`) is passed on as it is.
        for logger in self.trainer.loggers if self.trainer is not None else ():
            init = getattr(logger, "_wandb_init", None) if isinstance(logger, WandbLogger) else None
            if isinstance(init, dict) and "anonymous" in init and init["anonymous"] is None:
                del init["anonymous"]

    @staticmethod
    def _wants_progress(config: Namespace) -> bool:
        if config.get("progress", "validation") != "validation":
            return False
        trainer = config.get("trainer")
        if trainer is None or trainer.get("enable_progress_bar") is False:
            return False
        callbacks = trainer.get("callbacks") or []
        for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
            class_path = callback.get("class_path") if isinstance(callback, Namespace) else None
            with contextlib.suppress(ImportError, AttributeError, ValueError):
                module, _, name = str(class_path).rpartition(".")
                if issubclass(getattr(importlib.import_module(module), name), ProgressBar):
                    return False  # the config chose its own display
        return True

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if self.trainer.is_global_zero:
                self._discard_empty_run()
            raise

    def _discard_empty_run(self) -> None:
        """After a failure before the first step (or a resume with nothing to train): remove the W&B offline run
        folder this command opened and the run folder it made, unless they hold a checkpoint, a summary or
        results."""
        start = self._restored_step or 0
        if self.trainer.global_step != start:
            return  # steps were done: their logs and checkpoints stay, for --ckpt_path last
        logger = self.trainer.logger
        folder = run_directory(self.trainer)
        experiment = getattr(logger, "_experiment", None) if isinstance(logger, WandbLogger) else None
        if experiment is not None and is_offline(experiment):
            offline = Path(experiment.dir).parent
            with contextlib.suppress(Exception):
                experiment.finish(exit_code=1)
            shutil.rmtree(offline, ignore_errors=True)
            for link in offline.parent.iterdir() if offline.parent.is_dir() else ():
                if link.is_symlink() and not link.exists():  # latest-run, debug.log: pointed into the removed run
                    link.unlink(missing_ok=True)
        kept = (CHECKPOINTS, SUMMARY, "results.json", "predictions.csv", "metrics.csv")
        if folder.is_dir() and not any((folder / name).exists() for name in kept) and folder != Path.cwd():
            leftovers = [p for p in folder.iterdir() if not p.name.startswith("config") and p.name != "hparams.yaml"]
            if not leftovers and folder.resolve() != Path(self.trainer.default_root_dir).resolve():
                shutil.rmtree(folder, ignore_errors=True)
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()  # the logger's name folder, if this run was its only one

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()
        if type(self.trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the config chose
            self.trainer.strategy.checkpoint_io = AtomicCheckpointIO()

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        directory = run_directory(self.trainer)
        if self._restored_step is not None and self.trainer.global_step == self._restored_step:
            print(
                f"nothing to train: {self.config[self.subcommand]['ckpt_path']} is at step {self._restored_step}, "
                "where this configuration stops (trainer.max_epochs / max_steps). To train longer, raise "
                "--trainer.max_epochs (or --trainer.max_steps) with --ckpt_path last; the run's files are unchanged "
                f"in {directory}",
                flush=True,
            )
            self._discard_empty_run()  # the W&B part this command opened holds nothing
            return
        summary = fit_summary(
            self.trainer, self.model, time.perf_counter() - self._fit_started, self._restored_step or 0
        )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SUMMARY
        path.write_text(json.dumps(summary, indent=2) + "\n")
        if isinstance(self.trainer.logger, WandbLogger):
            self.trainer.logger.experiment.summary.update(
                {f"summary/{k}": v for k, v in summary.items() if not isinstance(v, dict)}
            )
        print(format_summary(summary), flush=True)
        print(written_files(directory, summary, self.trainer.logger, self._config_files()), flush=True)

    def after_test(self) -> None:
        if self.trainer.is_global_zero:
            print(f"report: units-lightning report {run_directory(self.trainer)}", flush=True)

    def _config_files(self) -> list[str]:
        """The options of this command that say where its runs are: its ``--config`` files and, when given on
        the command line, its ``default_root_dir`` and logger folder (``--ckpt_path best`` looks there)."""
        words, found = self._command_args, []
        for index, word in enumerate(words):
            option, has_value, value = word.partition("=")
            if option in _WHERE_OPTIONS:
                value = value if has_value else (words[index + 1] if index + 1 < len(words) else "")
                found.append(f"{option} {value}")
        return found


def cli_main(args: list[str] | None = None, run: bool = True) -> UnitsCLI:
    """Entry point of ``units-lightning`` and ``python -m units_lightning`` for the Lightning commands.

    With ``run=False`` the arguments name no subcommand and the CLI only builds ``cli.trainer``, ``cli.model``
    and ``cli.datamodule`` from them (``benchmarks/fit.py`` uses this to time a real run).
    """
    return UnitsCLI(
        UnitsMAML,
        EpisodicDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        parser_class=UnitsArgumentParser,
        parser_kwargs={"prog": "units-lightning"},
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"inference_mode": False},
    )


def overview() -> str:
    """``units-lightning --help``: every command, one line each."""
    width = max(len(name) for name in COMMANDS)
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items())
    return (
        "usage: units-lightning <command> [options]\n\n"
        "Units-ML (Pandey & Yu, CVPR 2022) on PyTorch Lightning: few-shot classifiers that say how sure they are,\n"
        "trained on the tasks that teach them most.\n\n"
        f"commands:\n{rows}\n\n"
        "`units-lightning <command> --help` lists a command's options. Errors from bad input are one paragraph;\n"
        f"{errors.DEBUG_FLAG} (or {errors.DEBUG_ENV}=1) shows the traceback."
    )


def _working_folder_importable() -> None:
    """Put the working folder first on the import path, as ``python -m`` does, so that a config's
    ``class_path: my_lab.samplers.MySampler`` finds ``./my_lab`` from the console script too."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def _dispatch(words: list[str], argv_given: bool) -> None:
    command = words[0]
    if command == "dashboard":
        from units_lightning.dashboard.workspace import main as dashboard_main

        return dashboard_main(words[1:])
    if command == "report":
        from units_lightning.dashboard.report import main as report_main

        return report_main(words[1:])
    if command in ("select", "ingest"):
        try:
            commands = importlib.import_module("units_lightning.annotation.commands")
        except ModuleNotFoundError as error:
            if error.name not in ("units_lightning.annotation", "units_lightning.annotation.commands"):
                raise
            sys.exit(f"units-lightning {command}: not available in this installation (no units_lightning.annotation)")
        return getattr(commands, f"{command}_main")(words[1:])
    if argv_given:
        cli_main(words)
        return None
    sys.argv = [sys.argv[0], *words]  # LightningCLI reads sys.argv itself (given args it warns)
    cli_main(None)
    return None


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (returns nothing, so the exit status is 0 on success).

    ``report``, ``dashboard``, ``select`` and ``ingest`` are this package's own commands; ``fit``, ``validate``,
    ``test`` and ``predict`` go to LightningCLI. Bad input ends with one paragraph and status 1 (2 for the command
    line itself) unless ``--debug`` or ``UNITS_LIGHTNING_DEBUG=1`` asks for the traceback.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    debug = errors.debug_requested(words)
    words = [word for word in words if word != errors.DEBUG_FLAG]
    _working_folder_importable()
    if not words or words[0] in ("-h", "--help", "help"):
        print(overview())
        return None
    command = words[0]
    if command not in COMMANDS and not command.startswith("-"):
        near = errors.closest(command, COMMANDS, cutoff=0.5)
        hint = f" Did you mean `units-lightning {near}`?" if near else ""
        print(f"units-lightning: error: unknown command {command!r}.{hint}\n\n{overview()}", file=sys.stderr)
        sys.exit(2)
    UnitsArgumentParser.debug = debug
    try:
        return _dispatch(words, argv is not None)
    except SIGTERMException:  # Lightning stops at the next step boundary, then exits with status 0: say 143
        print(
            "units-lightning: stopped by SIGTERM; continue with the same command and --ckpt_path last",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signal.SIGTERM)
    except Exception as error:
        shown = None if debug else errors.user_error(error)
        if shown is None:
            raise
        print(errors.format_error(f"units-lightning {command}", shown), file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        UnitsArgumentParser.debug = False

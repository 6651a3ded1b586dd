"""``UnitsCLI``: LightningCLI over ``UnitsMAML`` and the episodic data modules, and ``cli_main``, which builds it
for ``fit``, ``validate``, ``test`` and ``predict``."""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from units_lightning.callbacks import CollapseMonitor, CSVHistory, SaveRunConfig, SummaryWriter, dashboard_callbacks
from units_lightning.callbacks.prediction_writer import PredictionWriter
from units_lightning.callbacks.progress import ValidationProgress
from units_lightning.callbacks.run_version import RecordRunVersion
from units_lightning.cli.arguments import LIGHTNING_COMMANDS, UnitsArgumentParser
from units_lightning.cli.checkpoints import checkpoint_overrides, overrides_report, resolve_ckpt_path, settle_save_dir
from units_lightning.cli.cleanup import ConfigSnapshot, WandbFolderSnapshot, discard_empty_run, wandb_folder
from units_lightning.cli.compile_next import CompileForNextRun
from units_lightning.cli.config_sources import inherited_arguments, reset_inherited
from units_lightning.cli.console import (
    PROGRESS_MODES,
    format_summary,
    quiet,
    replayed_options,
    wants_progress,
    written_files,
)
from units_lightning.cli.interrupt import StopOnInterrupt
from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.module import UnitsMAML
from units_lightning.resume import AtomicCheckpointIO
from units_lightning.runs import checkpoint_run_folder, config_file_name, logger_run_folder, run_directory

DDP_STRATEGY = "units_lightning.strategies.DDPStrategy"
"""What ``--trainer.strategy ddp`` becomes: Lightning's DDP with DDP built on the training stream."""

__all__ = ["UnitsCLI", "cli_main"]

# Lightning's refusal of a checkpoint whose epoch lies past the configured max_epochs: a finished run resumed with a
# shorter length, which has nothing to train.
_PAST_THE_END = "You restored a checkpoint with current_epoch="


class UnitsCLI(LightningCLI):
    """LightningCLI with the data module's task shape and sampler linked into the model, the dashboard callbacks
    added to the trainer's (``--dashboard_callbacks false`` leaves them out), a quiet progress display
    (``--progress``) and a summary after ``fit`` that lists the files written.

    Every run gets ``RecordRunVersion`` (a resume continues the logger's run), ``SummaryWriter`` (``summary.json``,
    as ``trainer.fit`` with one writes it from Python) and ``CSVHistory`` (a resumed ``CSVLogger`` run keeps the
    rows of the segments before it). ``test`` writes ``results.json`` through the module's ``ResultsWriter``
    callback, as ``trainer.test`` does, into the folder of the run whose checkpoint it evaluates. A command that
    fails before its first step leaves no W&B run folder behind.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._output = contextlib.ExitStack()  # quiet logging and warnings, undone when the command ends
        self._restored_step: int | None = None
        self._wandb_before: WandbFolderSnapshot | None = None
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
            "--compile_for_next_run",
            type=bool,
            default=True,
            help="Where capture auto steps a fit with CUDA graphs only because it never compiled on this machine, "
            "compile it in a background process for the next run of the config (units_lightning.cli.compile_next); "
            "false leaves this out.",
        )
        parser.add_argument(
            "--progress",
            type=Literal[PROGRESS_MODES],  # choices= would show jsonargparse's wrapper as the type in --help
            default="validation",
            help="validation: one line per validation with the accuracy and beliefs (Lightning's and W&B's "
            "notices hidden), and on a terminal a heartbeat (step, steps/s, ETA) at most every 30 s between them; "
            "steps: Lightning's progress bar, redrawn at every step, and every notice.",
        )

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> Any:
        """Lightning's subcommand parser, with ``--ckpt_path``'s help naming this CLI's own ``best``."""
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        for action in parser._actions:
            if action.dest == "ckpt_path":
                action.help = (
                    'A checkpoint file, or "last" (the newest last.ckpt of this config\'s runs; `fit` starts a new '
                    'run where there is none) or "best" (the best checkpoint by val/acc of that run). Lightning\'s '
                    f"own keywords follow. {action.help or ''}"
                )
        return parser

    def _parse_ckpt_path(self) -> None:
        """LightningCLI replaces the model options with those saved in a ``--ckpt_path`` file: say which changed."""
        subcommand = self.config.get("subcommand")
        model = self.config[subcommand].get("model") if subcommand else None
        given = copy.deepcopy(model.as_dict()) if isinstance(model, Namespace) else None
        super()._parse_ckpt_path()
        if given is None or rank_zero_only.rank != 0:
            return
        changed = checkpoint_overrides(given, self.config[subcommand]["model"].as_dict())
        if changed:
            print(overrides_report(self.config[subcommand]["ckpt_path"], changed), file=sys.stderr, flush=True)

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
            quiet(self._output)
            if subcommand == "test" and "--verbose" not in self._command_args:
                config.verbose = False  # ResultsWriter prints the results; Lightning's table repeats 60 numbers
        self._settle_classes(config)
        # `--ckpt_path last` / `best` and the run a resumed `fit` (or a `test`) continues, settled before
        # LightningCLI reads the checkpoint's hyperparameters.
        self._restored_step = resolve_ckpt_path(config, subcommand)
        is_quiet = config.get("progress", "validation") == "validation"
        if self._restored_step is not None and subcommand == "fit" and is_quiet:
            # A resumed run writes on into its own checkpoint folder: Lightning's notice that the folder "exists and
            # is not empty" says nothing here (undone with the other filters of `quiet` when the command ends).
            warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")

    def _settle_classes(self, config: Namespace) -> None:
        """A class named by a later config file starts from its own defaults (jsonargparse would carry over the
        arguments of the class it replaces that the new one also accepts); say which values that concerns. The
        W&B logger writes under ``default_root_dir`` unless given a folder."""
        inherited = inherited_arguments(self._command_args, config)
        reset_inherited(config, inherited)
        if inherited and rank_zero_only.rank == 0:
            print("\n".join(item.describe() for item in inherited), file=sys.stderr, flush=True)
        settle_save_dir(config)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        # Resume: every checkpoint names the logger run that wrote it (a `fit` resumed from it continues that run).
        added = [*(dashboard_callbacks() if config.get("dashboard_callbacks", True) else [])]
        added += [RecordRunVersion(), SummaryWriter(), CSVHistory()]
        if self.subcommand == "fit" and config.get("compile_for_next_run", True):
            added.append(CompileForNextRun(self._parser(self.subcommand), config))
        if wants_progress(config):
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
        if config.trainer.get("strategy") == "ddp":
            # Lightning 2.6.6's "ddp" builds DDP on a side stream: a stream-mismatch warning at every backward on a GPU
            # (units_lightning.strategies); the same strategy, built on the training stream.
            config.trainer.strategy = Namespace(class_path=DDP_STRATEGY, init_args=Namespace())

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        # Lightning's WandbLogger passes `anonymous=None` to wandb.init, which wandb (0.2x on) answers with "The
        # anonymous setting has no effect and will be removed" on every command: leave out an option that asks for
        # nothing. One given in the config (`anonymous: true`) is passed on as it is.
        for logger in self.trainer.loggers if self.trainer is not None else ():
            init = getattr(logger, "_wandb_init", None) if isinstance(logger, WandbLogger) else None
            if isinstance(init, dict) and "anonymous" in init and init["anonymous"] is None:
                del init["anonymous"]

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the command; a failed one leaves nothing new (its W&B part, its config file), a finished run
        resumed with a shorter length says so and leaves its files as they were, and a resumed run that goes on
        with another config keeps the one before as ``config.<n>.yaml``."""
        snapshot = ConfigSnapshot(self._config_paths(subcommand)) if self.trainer.is_global_zero else None
        self._wandb_before = WandbFolderSnapshot(wandb_folder(self.trainer)) if snapshot is not None else None
        start = self._restored_step or 0
        try:
            with StopOnInterrupt(self.trainer) if subcommand == "fit" else contextlib.nullcontext():
                super()._run_subcommand(subcommand)
        except MisconfigurationException as error:
            if subcommand != "fit" or self._restored_step is None or _PAST_THE_END not in str(error):
                self._discard(snapshot, start, subcommand)
                raise
            self._nothing_to_train()  # Lightning restores the loops, then refuses: no step was taken
        except BaseException:
            self._discard(snapshot, start, subcommand)
            raise
        if snapshot is None:
            return
        if subcommand == "fit" and self._restored_step is not None and self.trainer.global_step > start:
            snapshot.keep_previous()
        elif subcommand == "fit" and self._restored_step is not None:
            snapshot.restore()  # nothing trained: the run's config stays the one its steps ran with

    def _config_paths(self, subcommand: str) -> list[Path]:
        """The config files this command may write: in its logger's run folder and, for a command that evaluates
        a checkpoint, in that checkpoint's run folder."""
        name = config_file_name(subcommand)
        logger = self.trainer.loggers[0] if self.trainer.loggers else None
        paths = [logger_run_folder(logger, self.trainer.default_root_dir) / name]
        folder = checkpoint_run_folder(self.config[subcommand].get("ckpt_path"))
        if folder is not None and subcommand != "fit":
            paths.append(folder / name)
        return paths

    def _discard(self, snapshot: ConfigSnapshot | None, start: int, subcommand: str) -> None:
        """A failed command leaves nothing new: its config files put back, its W&B part and empty run folder
        removed (a ``fit`` that took steps keeps them, for ``--ckpt_path last``)."""
        if snapshot is not None:
            snapshot.restore()
            discard_empty_run(self.trainer, start, subcommand, self._wandb_before)

    def before_fit(self) -> None:
        if type(self.trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the config chose
            self.trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if self.trainer.limit_val_batches == 0:
            drop_validation_checkpoints(self.trainer)

    def after_fit(self) -> None:
        """Print the summary ``SummaryWriter`` wrote and the run's files, or that a resumed run had nothing to
        train."""
        if not self.trainer.is_global_zero:
            return
        if self._restored_step is not None and self.trainer.global_step == self._restored_step:
            self._nothing_to_train()
            return
        writer = next((c for c in self.trainer.callbacks if isinstance(c, SummaryWriter)), None)
        if writer is None or writer.summary is None or writer.path is None:
            return
        print(format_summary(writer.summary), flush=True)
        options = replayed_options(self._command_args)
        print(written_files(writer.path.parent, writer.summary, self.trainer.logger, options), flush=True)

    def _nothing_to_train(self) -> None:
        """A resumed ``fit`` whose checkpoint is where (or past where) this configuration stops: say so, and drop
        the W&B part this command opened, which holds nothing (``_run_subcommand`` puts ``config.yaml`` back)."""
        if not self.trainer.is_global_zero:
            return
        print(
            f"finished at step {self._restored_step}; nothing to train: {self.config[self.subcommand]['ckpt_path']} "
            "is where this configuration stops, or past it (trainer.max_epochs / max_steps). To train longer, "
            "raise --trainer.max_epochs (or --trainer.max_steps) with --ckpt_path last; the run's files are "
            f"unchanged in {run_directory(self.trainer)}",
            flush=True,
        )
        discard_empty_run(self.trainer, self._restored_step or 0, "fit", self._wandb_before)

    def after_test(self) -> None:
        if self.trainer.is_global_zero:
            print(f"report: units-lightning report {run_directory(self.trainer)}", flush=True)


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


def drop_validation_checkpoints(trainer: Any) -> None:
    """Without validation (``--trainer.limit_val_batches 0``) a ``ModelCheckpoint`` that ranks by a ``val/`` value
    never has one: Lightning would warn at every epoch's end and write nothing. Take it out and say so once; the
    checkpoints without a monitor (``last.ckpt``, the label milestones) are kept."""
    dropped = [
        callback
        for callback in trainer.callbacks
        if isinstance(callback, ModelCheckpoint) and str(callback.monitor or "").startswith("val/")
    ]
    for callback in dropped:
        trainer.callbacks.remove(callback)
    if dropped and rank_zero_only.rank == 0:
        monitors = ", ".join(sorted({str(callback.monitor) for callback in dropped}))
        print(f"validation is off (--trainer.limit_val_batches 0): no checkpoint is kept by {monitors}", flush=True)

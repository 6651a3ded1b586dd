"""``ResultsWriter``: the test results (``results.json``, plots, W&B tables) of every ``test`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger

from units_lightning.evaluation.results import format_results, write_results
from units_lightning.resume import stored_run
from units_lightning.runs import run_directory

__all__ = ["ResultsWriter"]


class ResultsWriter(Callback):
    """After ``test``, write the module's ``test_results`` into the run directory and print a summary.

    ``UnitsMAML`` adds one to every trainer (``configure_callbacks``) unless the trainer already holds one, so
    that ``trainer.test(model, datamodule)`` from Python and ``units-lightning test`` write the same files:
    ``results.json`` (with the checkpoint and its step, task shape and seed of the evaluation), the PNG plots beside
    it and, with a W&B logger, W&B tables, images and summary numbers. Only rank zero writes.

    Args:
        output_dir: where to write (default: the run directory, where ``summary.json`` and ``config.yaml`` go).
        verbose: print the summary.
    """

    def __init__(self, output_dir: str | None = None, verbose: bool = True):
        self.output_dir, self.verbose = output_dir, verbose
        self.path: Path | None = None

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        results = getattr(pl_module, "test_results", None)
        if not trainer.is_global_zero or not results:
            return
        context: dict[str, Any] = {"checkpoint": None if trainer.ckpt_path is None else str(trainer.ckpt_path)}
        # The step of the checkpoint tested, read now: last.ckpt is overwritten when the run trains on, and the
        # report compares this step with the run's last validation.
        context["checkpoint_step"] = _stored_step(trainer.ckpt_path)
        datamodule = getattr(trainer, "datamodule", None)
        spec = getattr(datamodule, "eval_spec", None)
        if spec is not None:
            context["task"] = {"n_way": spec.n_way, "k_shot": spec.k_shot, "query_shots": spec.query_shots}
            context["seed"] = getattr(datamodule, "seed", None)
        directory = Path(self.output_dir) if self.output_dir is not None else run_directory(trainer)
        logger = trainer.logger
        wandb_run = logger.experiment if isinstance(logger, WandbLogger) else None
        self.path = write_results({**context, **results}, directory, wandb_run)
        if self.verbose:
            print(format_results(results) + f"\n  written to {self.path} (plots beside it)", flush=True)


def _stored_step(ckpt_path: str | None) -> int | None:
    """The global step stored in the checkpoint file at ``ckpt_path``; None without one or where it cannot be read."""
    if ckpt_path is None or not Path(ckpt_path).is_file():
        return None
    try:
        return stored_run(ckpt_path)["global_step"]
    except Exception:  # the results stand without it; the report then says less
        return None

"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

from units_lightning.callbacks import SaveRunConfig, dashboard_callbacks
from units_lightning.data.datamodule import EpisodicDataModule
from units_lightning.evaluation.prediction_writer import PredictionWriter
from units_lightning.evaluation.report import format_results, write_report
from units_lightning.module import UnitsMAML

__all__ = ["UnitsCLI", "cli_main", "fit_summary", "main", "run_directory"]

_SUMMARY_KEYS = {
    "val_accuracy": "val/acc",
    "val_vacuity": "val/vacuity",
    "val_dissonance": "val/dissonance",
    "val_incorrect_belief": "val/incorrect_belief",
    "val_correct_belief": "val/correct_belief",
}


def run_directory(trainer: pl.Trainer) -> Path:
    """Where a run's own files go: the W&B run's files folder, else the logger's or trainer's log dir.

    Unlike ``trainer.log_dir`` it broadcasts nothing, so rank zero alone may call it.
    """
    logger = trainer.logger
    if isinstance(logger, WandbLogger):
        return Path(logger.experiment.dir)
    if isinstance(logger, (CSVLogger, TensorBoardLogger)):
        return Path(logger.log_dir)
    if logger is not None and logger.save_dir is not None:
        return Path(logger.save_dir)
    return Path(trainer.default_root_dir)


def fit_summary(trainer: pl.Trainer, model: UnitsMAML, wall_time_s: float) -> dict[str, Any]:
    """Final validation metrics, labels spent, steps and wall time of a finished ``fit``."""
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
    return summary


def _format(summary: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    labels = summary["labels"]
    return "\n".join(
        [
            "units-lightning fit summary",
            f"  validation accuracy  {pct(summary['val_accuracy'])} (chance {pct(summary['chance_accuracy'])})",
            f"  vacuity {num(summary['val_vacuity'])} | dissonance {num(summary['val_dissonance'])} | "
            f"incorrect belief {num(summary['val_incorrect_belief'])} | "
            f"correct belief {num(summary['val_correct_belief'])}",
            f"  labels spent         {labels['query_sets']} query sets, {labels['query_images']} query images, "
            f"{labels['support_images']} support images",
            f"  steps {summary['steps']} in {summary['wall_time_s']:.1f} s",
        ]
    )


class UnitsCLI(LightningCLI):
    """LightningCLI with the data module's task shape linked into the model, the dashboard callbacks added to
    the trainer's (``--dashboard_callbacks false`` leaves them out) and a summary after ``fit``."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.n_way", "model.n_way", apply_on="instantiate")
        parser.link_arguments("data.image_shape", "model.image_shape", apply_on="instantiate")
        # Inert outside `predict`; there it writes predictions.csv/json (--prediction.threshold sets abstention).
        parser.add_lightning_class_args(PredictionWriter, "prediction")
        parser.add_argument(
            "--dashboard_callbacks",
            type=bool,
            default=True,
            help="Add the belief-dashboard callbacks (units_lightning.callbacks.dashboard_callbacks()) to "
            "trainer.callbacks; false leaves them out.",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("dashboard_callbacks", True):
            # LightningCLI appends trainer_defaults["callbacks"] to the configured trainer.callbacks.
            existing = self.trainer_defaults.get("callbacks", [])
            existing = list(existing) if isinstance(existing, list) else [existing]
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": [*existing, *dashboard_callbacks()]}

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()

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

    def after_test(self) -> None:
        """Write the test report (``results.json``, plots, W&B tables) into the run directory and print it."""
        results = getattr(self.model, "test_results", None)
        if not self.trainer.is_global_zero or not results:
            return
        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        spec = getattr(self.datamodule, "eval_spec", None)
        context: dict[str, Any] = {"checkpoint": None if ckpt_path is None else str(ckpt_path)}
        if spec is not None:
            context["task"] = {"n_way": spec.n_way, "k_shot": spec.k_shot, "query_shots": spec.query_shots}
            context["seed"] = getattr(self.datamodule, "seed", None)
        logger = self.trainer.logger
        wandb_run = logger.experiment if isinstance(logger, WandbLogger) else None
        path = write_report({**context, **results}, run_directory(self.trainer), wandb_run)
        print(format_results(results) + f"\n  written to {path} (plots beside it)", flush=True)


def cli_main(args: list[str] | None = None) -> UnitsCLI:
    """Entry point of ``units-lightning`` and ``python -m units_lightning``."""
    return UnitsCLI(
        UnitsMAML,
        EpisodicDataModule,
        subclass_mode_data=True,
        args=args,
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
        from units_lightning.dashboard import main as dashboard_main

        return dashboard_main(words[1:])
    if words and words[0] == "report":
        from units_lightning.report import main as report_main

        return report_main(words[1:])
    cli_main(None if argv is None else words)  # None: LightningCLI reads sys.argv itself

"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import WandbLogger

from units_lightning import keys
from units_lightning.callbacks import SaveRunConfig, dashboard_callbacks
from units_lightning.callbacks.prediction_writer import PredictionWriter
from units_lightning.dashboard.report import main as report_main
from units_lightning.dashboard.workspace import main as dashboard_main
from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.module import UnitsMAML
from units_lightning.runs import run_directory

__all__ = ["UnitsCLI", "cli_main", "fit_summary", "main"]

_SUMMARY_KEYS = {
    "val_accuracy": keys.stage_key(keys.VAL, keys.ACC),
    **{f"val_{name}": keys.stage_key(keys.VAL, name) for name in keys.BELIEFS},
}


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
        return dashboard_main(words[1:])
    if words and words[0] == "report":
        return report_main(words[1:])
    cli_main(None if argv is None else words)  # None: LightningCLI reads sys.argv itself

"""``PredictionWriter``: what ``units-lightning predict`` prints and writes for every query."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter

from units_lightning.runs import run_directory

__all__ = ["PredictionWriter", "prediction_rows"]

PREDICTIONS_CSV = "predictions.csv"
PREDICTIONS_JSON = "predictions.json"


def prediction_rows(
    outputs: Sequence[dict[str, Any]],
    threshold: float,
    query_names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    min_probability: float | None = None,
) -> list[dict[str, Any]]:
    """One row per query from ``UnitsMAML.predict_step`` outputs.

    Args:
        outputs: per-batch dicts with (T, M) ``prediction``, ``vacuity``, ``dissonance``, (T, M, N)
            ``probability`` and (T, N) ``classes``.
        threshold: a query abstains when its vacuity is ``>= threshold`` (kept below it, as in the test report).
        query_names: names of the queries in order (e.g. file names); default ``task<t>/query<m>``.
        class_names: names of the dataset's class ids; default the ids.
        min_probability: a query abstains too when its largest expected probability is below this (None: never).

    Returns:
        dicts with ``query``, ``predicted`` (class name), ``probabilities`` ({class name: p}), ``vacuity``,
        ``dissonance``, ``abstain``.
    """
    rows = []
    for batch_index, output in enumerate(outputs):
        for t in range(output["prediction"].shape[0]):
            names = [class_names[int(c)] if class_names else str(int(c)) for c in output["classes"][t]]
            for m in range(output["prediction"].shape[1]):
                vacuity = float(output["vacuity"][t, m])
                surest = float(output["probability"][t, m].max())
                unsure = min_probability is not None and surest < min_probability
                rows.append(
                    {
                        "query": None,
                        "predicted": names[int(output["prediction"][t, m])],
                        "probabilities": {
                            n: round(float(p), 6) for n, p in zip(names, output["probability"][t, m], strict=True)
                        },
                        "vacuity": round(vacuity, 6),
                        "dissonance": round(float(output["dissonance"][t, m]), 6),
                        "abstain": vacuity >= threshold or unsure,
                        "_default_name": f"batch{batch_index}/task{t}/query{m}",
                    }
                )
    if query_names is not None and len(query_names) != len(rows):
        raise ValueError(f"{len(query_names)} query names for {len(rows)} predictions")
    for index, row in enumerate(rows):
        default = row.pop("_default_name")
        row["query"] = query_names[index] if query_names is not None else default
    return rows


def _table(rows: Sequence[dict[str, Any]], limit: int = 50) -> str:
    width = max([5, *(len(r["query"]) for r in rows[:limit])])
    lines = [f"{'query':<{width}}  {'predicted':<16} {'p':>6} {'vacuity':>8} {'dissonance':>10}  decision"]
    for row in rows[:limit]:
        probability = row["probabilities"][row["predicted"]]
        decision = "abstain" if row["abstain"] else "predict"
        lines.append(
            f"{row['query']:<{width}}  {row['predicted']:<16} {probability:>6.3f} {row['vacuity']:>8.4f} "
            f"{row['dissonance']:>10.4f}  {decision}"
        )
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more")
    return "\n".join(lines)


class PredictionWriter(BasePredictionWriter):
    """Print a table and write ``predictions.csv`` and ``predictions.json`` after ``predict``.

    For each query: the predicted class, the expected probabilities of every class, vacuity, dissonance, and
    whether the model abstains (vacuity at or above ``threshold``, or, with ``min_probability``, a largest expected
    probability below it). Query and class names come from a ``FolderPredictionDataModule`` (file and folder
    names), else positions and class ids.

    Vacuity flags queries the model has little evidence about (unlike its training data); the largest expected
    probability ranks likely errors better (docs/RESULTS.md, "Ranking errors by vacuity or by the largest
    probability"), so ``min_probability`` is the filter for likely mistakes.

    Args:
        threshold: vacuity at or above which a prediction is marked as an abstention.
        min_probability: largest expected probability below which a prediction is marked as an abstention too
            (default None: vacuity alone decides).
        output_dir: where to write (default: the run directory, as for ``summary.json``).
    """

    def __init__(self, threshold: float = 0.2, min_probability: float | None = None, output_dir: str | None = None):
        super().__init__(write_interval="epoch")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
        if min_probability is not None and not 0.0 < min_probability <= 1.0:
            raise ValueError(f"min_probability must lie in (0, 1], got {min_probability}")
        self.threshold, self.min_probability, self.output_dir = threshold, min_probability, output_dir
        self.rows: list[dict[str, Any]] = []

    def write_on_epoch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Sequence[Any], batch_indices: Any
    ) -> None:
        if not trainer.is_global_zero:
            return
        if predictions and isinstance(predictions[0], list):  # several dataloaders: concatenate
            predictions = [p for loader in predictions for p in loader]
        datamodule = getattr(trainer, "datamodule", None)
        query_files = getattr(datamodule, "query_files", None)
        self.rows = prediction_rows(
            predictions,
            self.threshold,
            query_names=[p.name for p in query_files] if query_files is not None else None,
            class_names=getattr(datamodule, "class_names", None),
            min_probability=self.min_probability,
        )
        if self.output_dir is not None:
            directory = Path(self.output_dir)
        else:
            directory = run_directory(trainer)
        directory.mkdir(parents=True, exist_ok=True)
        self._write(directory)
        abstained = sum(r["abstain"] for r in self.rows)
        rule = f"vacuity >= {self.threshold:g}"
        if self.min_probability is not None:
            rule += f" or largest probability < {self.min_probability:g}"
        print(
            f"{_table(self.rows)}\n{len(self.rows)} queries, {abstained} abstain at {rule}; "
            f"written to {directory / PREDICTIONS_CSV} and {PREDICTIONS_JSON}",
            flush=True,
        )

    def _write(self, directory: Path) -> None:
        class_lists = {tuple(row["probabilities"]) for row in self.rows}
        # One task (your folders): a column per class name. Many tasks of different classes: per position.
        shared = len(class_lists) == 1
        width = max((len(c) for c in class_lists), default=0)
        columns = [f"p_{c}" for c in next(iter(class_lists))] if shared else [f"p_{i}" for i in range(width)]
        with open(directory / PREDICTIONS_CSV, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["query", "predicted", *columns, "vacuity", "dissonance", "abstain"])
            for row in self.rows:
                probabilities = list(row["probabilities"].values())
                writer.writerow(
                    [row["query"], row["predicted"], *probabilities, row["vacuity"], row["dissonance"], row["abstain"]]
                )
        payload = {"threshold": self.threshold, "min_probability": self.min_probability, "predictions": self.rows}
        (directory / PREDICTIONS_JSON).write_text(json.dumps(payload, indent=2) + "\n")

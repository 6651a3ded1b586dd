"""The metrics of every fit segment of a run, through ``units_lightning.csv_history``: each run's ``metrics.csv``
is moved aside before its next fit segment, numbered after the segments ``run.json`` records, and the whole history
is read back stitched (each step once); and the best validation of a history."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.tables.folders import RECORD, read_json
from units_lightning import csv_history
from units_lightning.csv_history import current_metrics, run_metrics, saved_segments

__all__ = ["best_validation", "current_metrics", "keep_metrics", "run_metrics", "saved_segments"]


def keep_metrics(folder: Path) -> list[Path]:
    """Move the ``metrics.csv`` of a run folder aside before a fit segment starts (``csv_history.keep_metrics``),
    to ``metrics/segment-<NN>.csv``: NN the fit segment that wrote it, the last one ``run.json`` records (never
    below a segment saved before). The paths written."""
    record = read_json(folder / RECORD)
    fit = record.get("fit") if isinstance(record, dict) else None
    recorded = len(fit.get("segments") or []) if isinstance(fit, dict) else 0
    return csv_history.keep_metrics(folder, first_index=recorded - len(current_metrics(folder)))


def _step(row: Mapping[str, Any]) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except (TypeError, ValueError, OverflowError):
        return None


def best_validation(rows: Iterable[Mapping[str, Any]], key: str = "val/acc") -> dict[str, Any] | None:
    """The best ``key`` of a metrics history and its step, and how many validations logged it (``None``: none)."""
    logged = [
        (float(row[key]), step) for row in rows if row.get(key) not in (None, "") and (step := _step(row)) is not None
    ]
    if not logged:
        return None
    value, step = max(logged, key=lambda pair: (pair[0], -pair[1]))
    return {"value": value, "step": step, "validations": len(logged)}

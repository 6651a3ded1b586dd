"""The metrics of every fit segment of a run: Lightning's ``CSVLogger`` deletes the ``metrics.csv`` of the version a
resumed fit continues, so each is moved aside before the next segment and the history is stitched back together."""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.tables.folders import RECORD, read_json

SEGMENTS = "metrics"
"""The folder of a run that keeps the ``metrics.csv`` of its earlier fit segments, as ``segment-<NN>.csv``."""
SEGMENT_FILE = re.compile(r"segment-(\d+)\.csv")


def _segment_index(path: Path) -> int | None:
    match = SEGMENT_FILE.fullmatch(path.name)
    return int(match.group(1)) if match else None


def current_metrics(folder: Path) -> list[Path]:
    """The ``metrics.csv`` files of the CSV loggers of a run folder (``<name>/<version>/metrics.csv``), oldest
    first: one, unless a fit started afresh in a new version (no ``last.ckpt`` to continue)."""
    found = [p for p in folder.glob("*/*/metrics.csv") if p.parts[-3] not in ("test", SEGMENTS) and p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def saved_segments(folder: Path) -> list[Path]:
    """The ``metrics/segment-<NN>.csv`` of a run folder, by NN (the order they were written)."""
    found = [p for p in (folder / SEGMENTS).glob("segment-*.csv") if _segment_index(p) is not None]
    return sorted(found, key=lambda p: (_segment_index(p), p.name))


def keep_metrics(folder: Path) -> list[Path]:
    """Move the ``metrics.csv`` of a run folder aside before a fit segment starts (the ``CSVLogger`` of a resumed
    fit would delete it): to ``metrics/segment-<NN>.csv``, NN the fit segment that wrote it (the last one ``run.json``
    records), but above every NN saved before, so that the files sort in the order they were written and nothing is
    overwritten. The paths written."""
    record = read_json(folder / RECORD)
    fit = record.get("fit") if isinstance(record, dict) else None
    recorded = len(fit.get("segments") or []) if isinstance(fit, dict) else 0
    following = max((_segment_index(p) for p in saved_segments(folder)), default=-1) + 1
    current, kept = current_metrics(folder), []
    for i, path in enumerate(current):
        index = max(recorded - len(current) + i, following)
        target = folder / SEGMENTS / f"segment-{index:02d}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        kept.append(target)
        following = index + 1
    return kept


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``, as ``csv.DictReader`` gives them (its own header's keys, ``""`` where empty)."""
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _step(row: Mapping[str, Any]) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except (ValueError, OverflowError):
        return None


def stitch_metrics(segments: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of successive fit segments as one history: a segment that starts at step ``s`` (its first row's)
    supersedes the rows at step ``s`` and after of those before it (a resumed fit restarts from its checkpoint,
    which can be before the last steps the stopped one logged). Rows keep their own keys; rows without a step are
    kept."""
    history: list[dict[str, Any]] = []
    for rows in segments:
        start = next((step for step in map(_step, rows) if step is not None), None)
        if start is not None:
            history = [row for row in history if (step := _step(row)) is None or step < start]
        history.extend(dict(row) for row in rows)
    return history


def run_metrics(folder: Path) -> list[dict[str, Any]]:
    """The whole metrics history of a run folder (every fit segment's, ``stitch_metrics``), in step order."""
    return stitch_metrics(read_metrics(p) for p in [*saved_segments(folder), *current_metrics(folder)])


def best_validation(rows: Iterable[Mapping[str, Any]], key: str = "val/acc") -> dict[str, Any] | None:
    """The best ``key`` of a metrics history and its step, and how many validations logged it (``None``: none)."""
    logged = [
        (float(row[key]), step) for row in rows if row.get(key) not in (None, "") and (step := _step(row)) is not None
    ]
    if not logged:
        return None
    value, step = max(logged, key=lambda pair: (pair[0], -pair[1]))
    return {"value": value, "step": step, "validations": len(logged)}

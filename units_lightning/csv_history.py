"""A ``CSVLogger`` run's whole metrics history, across the fit segments of a resumed run.

A fit resumed with ``--ckpt_path last`` continues its ``CSVLogger`` version (``units_lightning.resume``), and
Lightning's CSV writer deletes the ``metrics.csv`` it finds there when the resumed fit starts: without a copy, the
history of every segment but the last is lost. The segments are kept beside it, in ``<log folder>/metrics/
segment-<NN>.csv`` (NN in the order they were written), by ``keep_metrics`` (moves ``metrics.csv`` aside before a
fit starts) or ``save_segment`` (copies it while the fit runs; ``units_lightning.callbacks.CSVHistory`` does, so
every fit keeps it). ``run_metrics`` and ``log_metrics`` read the history back as one: each step once, the latest
segment's (``stitch_metrics``).

Pure file functions, no Lightning: the report reads them.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from units_lightning.atomic import write_atomically

__all__ = [
    "METRICS",
    "SEGMENTS",
    "current_metrics",
    "history_files",
    "keep_metrics",
    "log_metrics",
    "next_segment",
    "read_metrics",
    "run_metrics",
    "save_segment",
    "saved_segments",
    "stitch_metrics",
]

METRICS = "metrics.csv"  # the file CSVLogger writes in its log folder
SEGMENTS = "metrics"
"""The folder beside ``metrics.csv`` that keeps the ``metrics.csv`` of each fit segment, as ``segment-<NN>.csv``."""
_SEGMENT_FILE = re.compile(r"segment-(\d+)\.csv")
_NOT_LOGS = ("test", SEGMENTS)  # folders under a run folder whose metrics.csv is not the fit's


def _segment_index(path: Path) -> int | None:
    match = _SEGMENT_FILE.fullmatch(path.name)
    return int(match.group(1)) if match else None


def saved_segments(folder: str | os.PathLike) -> list[Path]:
    """The ``metrics/segment-<NN>.csv`` of ``folder``, by NN (the order they were written)."""
    found = [p for p in (Path(folder) / SEGMENTS).glob("segment-*.csv") if _segment_index(p) is not None]
    return sorted(found, key=lambda p: (_segment_index(p), p.name))


def next_segment(folder: str | os.PathLike) -> int:
    """The NN of the next segment of ``folder``: one above every NN saved before, so nothing is overwritten."""
    return max((_segment_index(p) for p in saved_segments(folder)), default=-1) + 1


def current_metrics(folder: str | os.PathLike) -> list[Path]:
    """The ``metrics.csv`` files of ``folder``, oldest first: its own (``folder`` is a logger's log folder) and
    those of the loggers under it (``<name>/<version>/metrics.csv``, ``folder`` being their ``save_dir``)."""
    folder = Path(folder)
    found = [p for p in folder.glob(f"*/*/{METRICS}") if p.parts[-3] not in _NOT_LOGS and p.is_file()]
    found += [folder / METRICS] if (folder / METRICS).is_file() else []
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def keep_metrics(folder: str | os.PathLike, first_index: int = 0) -> list[Path]:
    """Move the ``metrics.csv`` files of ``folder`` (``current_metrics``) aside, to ``metrics/segment-<NN>.csv``,
    before a fit whose ``CSVLogger`` would delete them starts. NN counts from ``first_index`` (the fit segment that
    wrote the oldest, where the caller counts segments) but stays above every NN saved before, so that the files
    sort in the order they were written and nothing is overwritten.

    Returns:
        The paths written, oldest first.
    """
    following = next_segment(folder)
    kept = []
    for i, path in enumerate(current_metrics(folder)):
        index = max(first_index + i, following)
        target = Path(folder) / SEGMENTS / f"segment-{index:02d}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        kept.append(target)
        following = index + 1
    return kept


def save_segment(folder: str | os.PathLike, index: int) -> Path | None:
    """Copy the ``metrics.csv`` of the log folder ``folder`` to ``metrics/segment-<index>.csv`` (``write_atomically``:
    a kill never leaves half a segment). The path written, or None without a ``metrics.csv``."""
    source = Path(folder) / METRICS
    if not source.is_file():
        return None
    target = Path(folder) / SEGMENTS / f"segment-{index:02d}.csv"
    with open(source, "rb") as metrics:
        write_atomically(target, lambda file: shutil.copyfileobj(metrics, file))
    return target


def history_files(folder: str | os.PathLike) -> list[Path]:
    """The files of one log folder's history, oldest first: its saved segments by NN, then its ``metrics.csv``."""
    current = Path(folder) / METRICS
    return [*saved_segments(folder), *([current] if current.is_file() else [])]


def read_metrics(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``, as ``csv.DictReader`` gives them (its own header's keys, ``""`` where empty)."""
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _step(row: Mapping[str, Any]) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except (TypeError, ValueError, OverflowError):
        return None


def stitch_metrics(segments: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of successive fit segments as one history: a segment that starts at step ``s`` (its first row's)
    supersedes the rows at step ``s`` and after of those before it (a resumed fit restarts from its checkpoint,
    which can be before the last steps the stopped one logged; a copy of a segment is superseded by the segment).
    Rows keep their own keys; rows without a step are kept."""
    history: list[dict[str, Any]] = []
    for rows in segments:
        start = next((step for step in map(_step, rows) if step is not None), None)
        if start is not None:
            history = [row for row in history if (step := _step(row)) is None or step < start]
        history.extend(dict(row) for row in rows)
    return history


def log_metrics(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The whole history of one log folder (``history_files``, stitched): what ``units-lightning report`` reads."""
    return stitch_metrics(read_metrics(p) for p in history_files(folder))


def run_metrics(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The whole metrics history of ``folder`` and the CSV logs under it (``<name>/<version>``), stitched.

    Read in the order written: the segments saved in ``folder`` itself, then each log folder under it (its
    segments, then its ``metrics.csv``; the folders by the time of their newest file), then ``folder``'s own
    ``metrics.csv``.
    """
    folder = Path(folder)
    logs = [d for d in folder.glob("*/*") if d.is_dir() and d.parts[-2] not in _NOT_LOGS]
    groups = [files for d in logs if (files := history_files(d))]
    groups.sort(key=lambda files: max(p.stat().st_mtime_ns for p in files))
    own = folder / METRICS
    paths = [*saved_segments(folder), *(p for files in groups for p in files), *([own] if own.is_file() else [])]
    return stitch_metrics(read_metrics(p) for p in paths)

"""Read a run's logged rows back from whatever logger wrote them: an offline W&B run, CSV or TensorBoard.

``read_run_log`` reads the log of a run folder (``units_lightning.runs``): ``metrics.csv`` (with the segments a
resumed fit kept beside it, ``units_lightning.csv_history``) or TensorBoard events inside it, or the W&B run of the
same id beside it (``<save_dir>/wandb/*-<id>``), every part of it in order (a resumed run and a ``test`` of its
checkpoint add parts). ``read_log`` reads one log file or folder as given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from units_lightning.csv_history import METRICS, SEGMENTS, history_files, log_metrics, read_metrics
from units_lightning.dashboard.wandb_offline import read_history

__all__ = ["RunLog", "find_log", "merge_parts", "read_log", "read_run_log", "validated_step", "wandb_parts"]


@dataclass
class RunLog:
    """A run's logged rows, each a dict of key -> value with ``step`` (global step) and, where logged, ``epoch``.

    Attributes:
        source: ``"wandb"``, ``"csv"`` or ``"tensorboard"``.
        path: the file or folder read (for a W&B run of several parts, its newest part).
        rows: one dict per logging call (CSV, W&B) or per step (TensorBoard), in order.
        parts: the W&B run folders read, oldest first, where there were several.
    """

    source: str
    path: Path
    rows: list[dict[str, Any]]
    parts: list[Path] = field(default_factory=list)

    @property
    def keys(self) -> set[str]:
        return set().union(*self.rows) if self.rows else set()


def _newest(paths: list[Path]) -> Path:
    return max(paths, key=lambda p: (p.stat().st_mtime, str(p)))


def find_log(run_dir: str | Path) -> tuple[str, Path]:
    """Which log to read in ``run_dir``: an offline W&B run, else a ``metrics.csv``, else TensorBoard events.

    ``run_dir`` may be the log itself, the folder of one run, or a folder above (e.g. a config's
    ``default_root_dir``): the newest log of the first kind found is used.

    Raises:
        FileNotFoundError: if ``run_dir`` does not exist or holds no log of any kind.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir} does not exist")
    if run_dir.is_file():
        if run_dir.name.endswith(".wandb"):
            return "wandb", run_dir.parent
        if run_dir.suffix == ".csv":
            return "csv", run_dir
        if "tfevents" in run_dir.name:
            return "tensorboard", run_dir
        raise FileNotFoundError(f"{run_dir} is not a W&B run file, a CSV file or a TensorBoard event file")
    wandb_runs = [p.parent for p in run_dir.rglob("run-*.wandb") if not p.parent.is_symlink()]
    if wandb_runs:
        return "wandb", _newest(wandb_runs)
    csv_files = list(run_dir.rglob("metrics.csv"))
    if csv_files:
        return "csv", _newest(csv_files)
    event_files = list(run_dir.rglob("events.out.tfevents.*"))
    if event_files:
        return "tensorboard", _newest(event_files)
    raise FileNotFoundError(
        f"no logs in {run_dir}: looked for an offline W&B run (offline-run-*/run-*.wandb), a CSVLogger "
        "metrics.csv and TensorBoard events.out.tfevents.* files, in the folder and below it"
    )


def read_log(run_dir: str | Path) -> RunLog:
    """Find the log in ``run_dir`` (see ``find_log``) and read its rows."""
    source, path = find_log(run_dir)
    reader = {"wandb": _read_wandb, "csv": _read_csv, "tensorboard": _read_tensorboard}[source]
    return RunLog(source, path, reader(path))


def wandb_parts(run_folder: str | Path) -> list[Path]:
    """The W&B run folders of a run folder ``<save_dir>/<project>/<run id>``: ``<save_dir>/wandb/*-<run id>`` that
    hold a ``run-<id>.wandb`` file, oldest first (each process that logged to the run wrote one).

    A part that started in the same second as the one before it is ``*-<run id>-<n>`` (W&B adds the suffix rather
    than write into the earlier folder); it sorts after that one.
    """
    run_folder = Path(run_folder)
    run_id = run_folder.name
    wandb_dir = run_folder.parent.parent / "wandb"
    if not wandb_dir.is_dir():
        return []
    pattern = re.compile(rf"(?:offline-)?run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    parts = []
    for path in wandb_dir.iterdir():
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not path.is_symlink() and (path / f"run-{run_id}.wandb").is_file():
            parts.append((match[1], int(match[2] or 0), path))
    return [path for *_, path in sorted(parts)]


def _is_training(rows: list[dict[str, Any]]) -> bool:
    return any(key.startswith("train/") for row in rows for key in row)


def merge_parts(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One history from the parts of a run, oldest first.

    A part that trained (it logged ``train/`` keys) continues the ones before it: rows they logged at or after
    its first step were logged again after a resume, and are dropped. Parts that only evaluated (a ``test`` of
    the run's checkpoint) are left out: their results are in ``results.json``.
    """
    merged: list[dict[str, Any]] = []
    for rows in parts:
        if not _is_training(rows):
            continue
        steps = [row["step"] for row in rows if finite(row.get("step"))]
        if steps:
            first = min(steps)
            merged = [row for row in merged if not (finite(row.get("step")) and row["step"] >= first)]
        merged.extend(rows)
    return merged


def read_run_log(run_folder: str | Path) -> RunLog | None:
    """The log of a run folder, whichever logger wrote it, or None where it has none (a run without a logger).

    Looks for ``metrics.csv`` (``CSVLogger``; with the segments of a resumed run, each step once: see
    ``units_lightning.csv_history``) and TensorBoard events in the folder, then for the parts of the W&B run of the
    same id (see ``wandb_parts`` and ``merge_parts``).
    """
    run_folder = Path(run_folder)
    csv_files = history_files(run_folder)  # metrics.csv, and the segments of earlier fits of a resumed run
    if csv_files:
        return RunLog("csv", csv_files[-1], _numbers(log_metrics(run_folder)))
    if any(run_folder.glob("events.out.tfevents.*")):
        return RunLog("tensorboard", run_folder, _read_tensorboard(run_folder))  # every event file in it
    parts = wandb_parts(run_folder)
    if parts:
        return RunLog("wandb", parts[-1], merge_parts([_read_wandb(part) for part in parts]), parts)
    return None


def _read_wandb(path: Path) -> list[dict[str, Any]]:
    rows = []
    for row in read_history(path):
        if "trainer/global_step" in row:
            row["step"] = row["trainer/global_step"]
        rows.append(row)
    return rows


def _number(text: str | None) -> float | None:
    if not text:  # an empty cell, or none where a row is shorter than the header
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _numbers(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """CSV rows with their numbers as floats, empty and non-numeric cells left out."""
    return [{key: value for key, text in row.items() if key and (value := _number(text)) is not None} for row in rows]


def _read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV file; for a ``CSVLogger``'s ``metrics.csv``, the whole history of its folder (the segments
    a resumed fit kept beside it first)."""
    if path.name == METRICS and (path.parent / SEGMENTS).is_dir():
        return _numbers(log_metrics(path.parent))
    return _numbers(read_metrics(path))


def _read_tensorboard(path: Path) -> list[dict[str, Any]]:
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as error:
        raise ImportError(
            f"{path} is a TensorBoard log, and reading it needs the tensorboard package: pip install tensorboard"
        ) from error
    accumulator = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    by_step: dict[int, dict[str, Any]] = {}
    for tag in accumulator.Tags()["scalars"]:
        for event in accumulator.Scalars(tag):
            by_step.setdefault(event.step, {"step": event.step})[tag] = float(event.value)
    return [by_step[step] for step in sorted(by_step)]


def finite(value: Any) -> bool:
    """Whether a logged value is a finite number (NaN marks "nothing to measure", e.g. no query that sure)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validated_step(row: dict[str, Any]) -> int | None:
    """The global step a logged validation row validated, as ``fit`` prints it and names checkpoints (``step 60``
    after 60 steps); None for a row without a step.

    Lightning logs a validation run inside ``fit`` at the index of the step just taken, global step - 1: the
    validation after step 60 is the logged row of step 59, and the checkpoint it saves holds global step 60.
    """
    return int(row["step"]) + 1 if finite(row.get("step")) else None

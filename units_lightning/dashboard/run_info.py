"""What the report knows of a run: its folder's files (summary, config, test results) and its log.

``runs_to_report`` turns what a person typed (``runs/quickstart``, a run folder, several of them, or a log file)
into the runs to draw; ``RunInfo.setting`` names the paper's setting a run's config is (MAML, Units-NTS,
Units-ST, Units-ML) from its loss and sampler classes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from units_lightning.dashboard.run_log import RunLog, finite, read_log, read_run_log, validated_step
from units_lightning.keys import ACC, VAL, stage_key
from units_lightning.runs import CONFIG, RESULTS, SUMMARY, find_run_folders, is_run_folder

__all__ = ["RunInfo", "describe_run", "runs_to_report", "setting_name", "stored_step"]

# (loss class, sampler class) -> the paper's name for the setting (docs/REFERENCE.md, "What one training step does").
_SETTINGS = {
    ("CrossEntropyLoss", "RandomSampler"): "MAML",
    ("EvidentialLoss", "RandomSampler"): "Units-NTS",
    ("EvidentialLoss", "SingleTaskSelectionSampler"): "Units-ST",
    ("EvidentialLoss", "MultiQuerySampler"): "Units-ML",
}


@dataclass
class RunInfo:
    """One run as the report shows it.

    Attributes:
        folder: the run folder (or, for a bare log, the folder it was read from).
        label: the run's name on the page (``Units-ML``, or with its folder where names repeat).
        summary: ``summary.json`` of its ``fit``, or None.
        results: ``results.json`` of its ``test``, or None.
        config: its resolved ``config.yaml``, or None.
        log: its logged rows, or None where it has none.
    """

    folder: Path
    label: str = ""
    summary: dict[str, Any] | None = None
    results: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    log: RunLog | None = None

    @property
    def trained(self) -> bool:
        """Whether the run has training history (a summary or training rows), not only an evaluation."""
        return self.summary is not None or bool(self.log and any(k.startswith("train/") for k in self.log.keys))

    @property
    def setting(self) -> str:
        return setting_name(self.config) if self.config else "run"

    @property
    def n_way(self) -> int | None:
        """N of the run's N-way training tasks (its config, else its summary's chance accuracy), or None."""
        init_args = ((self.config or {}).get("data") or {}).get("init_args") or {}
        if isinstance(init_args.get("n_way"), int):
            return init_args["n_way"]
        chance = (self.summary or {}).get("chance_accuracy")
        return round(1 / chance) if isinstance(chance, int | float) and chance > 0 else None

    def validations(self) -> dict[int, float]:
        """The logged validation accuracies by the global step they validated (``run_log.validated_step``: as
        ``fit`` prints it and checkpoints are named), oldest first."""
        key = stage_key(VAL, ACC)
        rows = self.log.rows if self.log else []
        return {validated_step(row): row[key] for row in rows if finite(row.get(key)) and finite(row.get("step"))}

    @property
    def last_validation_step(self) -> int | None:
        """The global step of the run's last validation, the one ``summary.json`` reports: from the log, else (no
        log) the summary's steps; None for a run that never validated."""
        logged = self.validations()
        if logged:
            return max(logged)
        steps = (self.summary or {}).get("steps")
        return steps if isinstance(steps, int) and (self.summary or {}).get("val_accuracy") is not None else None

    @property
    def tested_step(self) -> int | None:
        """The step of the checkpoint the run's ``results.json`` tested, or None where it cannot be told.

        ``results.json`` records it (``checkpoint_step``); for one written before it did, the step in the
        checkpoint's name (``step200-acc0.9000.ckpt``), else the step stored in the checkpoint file if that file
        is no newer than the results (``last.ckpt`` is rewritten when the run trains on).
        """
        results = self.results or {}
        if isinstance(results.get("checkpoint_step"), int):
            return results["checkpoint_step"]
        checkpoint = results.get("checkpoint")
        if not checkpoint:
            return None
        path = Path(str(checkpoint))
        named = re.search(r"(?:^|[^a-z])step=?(\d+)", path.name)
        if named:
            return int(named.group(1))
        written = self.folder / RESULTS
        if path.is_file() and written.is_file() and path.stat().st_mtime <= written.stat().st_mtime:
            return stored_step(path)
        return None

    @property
    def data(self) -> str:
        """``SyntheticGlyphs, 5-way 1-shot``, from the config."""
        data = (self.config or {}).get("data") or {}
        init_args = data.get("init_args") or {}
        name = str(data.get("class_path", "")).rsplit(".", 1)[-1].removesuffix("DataModule")
        shape = f"{init_args['n_way']}-way {init_args['k_shot']}-shot" if {"n_way", "k_shot"} <= set(init_args) else ""
        return ", ".join(part for part in (name, shape) if part)


def stored_step(path: str | Path) -> int | None:
    """The global step stored in a checkpoint file, or None where it cannot be read."""
    from units_lightning.resume import stored_run  # torch: only where a checkpoint is read

    try:
        return stored_run(path)["global_step"]
    except Exception:  # not a readable checkpoint: the report says less, it does not fail
        return None


def _class_name(spec: Any) -> str:
    return str(spec.get("class_path", "")).rsplit(".", 1)[-1] if isinstance(spec, dict) else ""


def setting_name(config: dict[str, Any]) -> str:
    """The paper's name for a run's setting, from its config's loss and sampler (``Units-ML``); for other
    combinations the two class names (``EvidentialLoss + NeighbourClassSampler``).

    >>> setting_name({"model": {"loss": {"class_path": "units_lightning.losses.CrossEntropyLoss"}},
    ...               "data": {"init_args": {"sampler": {"class_path": "units_lightning.samplers.RandomSampler"}}}})
    'MAML'
    """
    loss = _class_name((config.get("model") or {}).get("loss")) or "EvidentialLoss"
    sampler = _class_name(((config.get("data") or {}).get("init_args") or {}).get("sampler")) or "RandomSampler"
    return _SETTINGS.get((loss, sampler), f"{loss} + {sampler}")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _yaml(path: Path) -> dict[str, Any] | None:
    try:
        loaded = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def describe_run(folder: str | Path) -> RunInfo:
    """Read a run folder's summary, test results, config and log."""
    folder = Path(folder)
    return RunInfo(
        folder=folder,
        summary=_json(folder / SUMMARY),
        results=_json(folder / RESULTS),
        config=_yaml(folder / CONFIG),
        log=read_run_log(folder),
    )


def _bare_log(path: Path) -> RunInfo:
    """A log given directly (a W&B run folder, ``metrics.csv``, an event file, or a folder holding one)."""
    log = read_log(path)
    folder = path if path.is_dir() else path.parent
    files = log.path / "files" if log.source == "wandb" else log.path.parent
    return RunInfo(folder=folder, summary=_json(files / SUMMARY), config=_yaml(files / CONFIG), log=log)


def _line(run: RunInfo) -> str:
    summary = run.summary or {}
    accuracy = summary.get("val_accuracy")
    shown = f"val acc {100 * accuracy:.2f}%" if isinstance(accuracy, int | float) else "no summary"
    return f"  {run.folder}  ({run.setting}, {summary.get('steps', '?')} steps, {shown})"


def runs_to_report(paths: list[str | Path]) -> list[RunInfo]:
    """The runs that ``units-lightning report PATH [PATH ...]`` draws.

    Each path is a run folder; or a folder above run folders (``runs/quickstart``), which must hold exactly one run
    with training history; or a log (file or folder) without a run folder around it.

    Raises:
        FileNotFoundError: a path that does not exist or holds neither a run folder nor a log.
        ValueError: a folder with several trained runs (the message lists them: name one, or several to compare).
    """
    runs: list[RunInfo] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        if path.is_dir() and is_run_folder(path):
            runs.append(describe_run(path))
            continue
        folders = find_run_folders(path) if path.is_dir() else []
        found = [describe_run(folder) for folder in folders]
        trained = [run for run in found if run.trained]
        if len(trained) == 1 or (not trained and len(found) == 1):
            runs.append((trained or found)[0])
        elif len(trained) > 1:
            listing = "\n".join(_line(run) for run in trained)
            raise ValueError(
                f"{path} holds {len(trained)} trained runs; name the one to draw, or several to compare them side "
                f"by side:\n{listing}"
            )
        else:
            runs.append(_bare_log(path))  # raises FileNotFoundError where there is no log either
    return runs

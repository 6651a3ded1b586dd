"""What a run's folder holds: its record of commands (``run.json``), ``done.json`` once every test succeeded, the
test results, and from these the run's state (done, new, partial, or made with other arguments)."""

from __future__ import annotations

import json
import os
import shlex
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.tables.grid import Options, Run, Target, fit_identity, last_checkpoint, shown, targets_of

RECORD, DONE = "run.json", "done.json"


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Write JSON through a temporary file and a rename, so a kill never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)


def read_results(run: Run, target: Target) -> dict | None:
    results = read_json(run.folder / "test" / target.name / "results.json")
    return results if isinstance(results, dict) and "accuracy" in results else None


def finished_elsewhere(runs: list[Run], elsewhere: list[list[Run]]) -> tuple[list[Run], list[str]]:
    """``runs`` with each one that is not finished (``done.json``) taken from the first grid of ``elsewhere`` (the same
    grid built under other roots, ``build_grid``) that holds it finished: the tables of runs that several calls or
    hosts left in separate folders, without copying them into one. Returns the runs and a line for every run
    finished under more than one of the folders (the first is used)."""
    chosen, notes = [], []
    for run, *others in zip(runs, *elsewhere, strict=True):
        finished = [r for r in (run, *others) if (r.folder / DONE).is_file()]
        if len(finished) > 1:
            folders = ", ".join(shown(r.folder) for r in finished)
            notes.append(f"{run.label}: finished in {folders}; using {shown(finished[0].folder)}")
        chosen.append(finished[0] if finished else run)
    return chosen, notes


def now() -> str:
    """The time, in UTC and whole seconds, as the records write it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def fit_finished(run: Run, options: Options) -> bool:
    """The fit returned 0 once (recorded), the command's summary (written only after a whole fit) exists, or the
    newest ``last.ckpt`` has spent the label budget (a fit killed after it, which ``--ckpt_path last`` refuses)."""
    record = read_json(run.folder / RECORD) or {}
    if (record.get("fit") or {}).get("finished"):
        return True
    if any(p.relative_to(run.folder).parts[0] != "test" for p in run.folder.rglob("summary.json")):
        return True
    return _budget_spent(run, options)


def _budget_spent(run: Run, options: Options) -> bool:
    budget = run.config.label_budget
    for option in options.extra:
        if option.startswith("--model.label_budget="):
            budget = int(option.split("=", 1)[1])
    last = last_checkpoint(run) if budget is not None else None
    if last is None:
        return False
    import torch

    try:
        checkpoint = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable: fit says so, and resumes from the one before
        return False
    return int((checkpoint.get("label_ledger") or {}).get("query_sets", 0)) >= budget


def status(run: Run, options: Options) -> str:
    """``done``, ``new``, ``partial: ...`` or ``conflict: ...`` (the folder was made with other arguments)."""
    if (run.folder / DONE).is_file():
        return "done"
    record = read_json(run.folder / RECORD)
    if record and record.get("identity") not in (None, fit_identity(run, options)):
        return (
            f"conflict: {shown(run.folder)} was made with other arguments ({shlex.join(record['identity'])}); "
            "use another --root, the same --extra and --logger, or delete the folder"
        )
    if fit_finished(run, options):
        targets = targets_of(run.config)
        tested = sum(read_results(run, t) is not None for t in targets)
        return f"partial: fit finished, {tested} of {len(targets)} tests done"
    last = last_checkpoint(run)
    if last is not None:
        from units_lightning.resume import stored_run

        try:
            step = stored_run(last)["global_step"]
        except Exception:  # cut short by a writer that was not atomic: fit says so and uses the one before
            step = "?"
        return f"partial: last.ckpt at step {step}"
    return "new"

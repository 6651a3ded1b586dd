"""What the annotation commands (``select``, ``ingest``, ``serve``) share: the Label Studio token, how a path is
shown, restoring a checkpoint's weights, and fetching and checking a batch's answers.

Kept apart from the commands so that each command's module imports this one and never another command's helpers
(``serve`` builds on ``select``'s parser and ``ingest``'s fetch; none of them imports ``commands``, the dispatcher).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from units_lightning.annotation.answers import Answer, read_label_studio_export
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import AnnotationBatch
from units_lightning.annotation.label_studio import LabelStudio
from units_lightning.annotation.label_studio_project import batch_export, where_sent

# The model and the ingest outcome bring torch: the commands import them when they run, not before --help.
if TYPE_CHECKING:
    from units_lightning.annotation.ingest import IngestOutcome
    from units_lightning.module import UnitsMAML

__all__ = [
    "TOKEN_VARIABLE",
    "api_token",
    "disputes_csv",
    "fetch_answers",
    "restore",
    "schedule_at",
    "shown",
    "write_disputes",
]

TOKEN_VARIABLE = "LABEL_STUDIO_API_KEY"


def shown(path: str | Path) -> str:
    """``path`` relative to the working folder when it lies inside it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def api_token(given: str | None) -> str:
    """The Label Studio API token: ``given`` (an option), else ``$LABEL_STUDIO_API_KEY``, else empty."""
    return given or os.environ.get(TOKEN_VARIABLE, "")


def schedule_at(model: UnitsMAML, checkpoint: dict[str, Any]) -> tuple[int, float]:
    """The training step of ``checkpoint`` and the lambda its run scored with then (``UnitsMAML.schedule_epoch``:
    steps over ``schedule_steps_per_epoch`` when set, else the trainer's epoch)."""
    step = int(checkpoint.get("global_step", 0))
    epoch = (
        step / model.schedule_steps_per_epoch if model.schedule_steps_per_epoch else float(checkpoint.get("epoch", 0))
    )
    return step, float(model.lam(epoch))


def restore(model: UnitsMAML, ckpt_path: str | None) -> tuple[int, float]:
    """Load ``ckpt_path``'s weights into ``model`` (weights only, shapes checked); returns its step and lambda."""
    from units_lightning.evaluation.checkpoints import load_checkpoint

    if ckpt_path is None:
        return 0, float(model.lam(0.0))
    checkpoint = load_checkpoint(ckpt_path, leave_out="pass another --ckpt_path")
    model.on_load_checkpoint(checkpoint)  # shapes checked, the ledger restored
    model.load_state_dict(checkpoint["state_dict"])
    return schedule_at(model, checkpoint)


def fetch_answers(batch: AnnotationBatch, folder: Path, url: str | None, token: str | None) -> tuple[list[Answer], str]:
    """The answers of the batch's tasks in Label Studio, fetched through the API (``batch_export``; the export is
    kept in ``<batch folder>/label_studio/export.json``)."""
    sent = where_sent(batch)
    client = LabelStudio(url or sent["url"], api_token(token))
    source = f"{client.url} project {sent['project']}"
    export = batch_export(batch, client)
    write_text_atomically(folder / "label_studio" / "export.json", json.dumps(export, indent=1) + "\n")
    return read_label_studio_export(export, source), source


def disputes_csv(outcome: IngestOutcome) -> str:
    """The disputed images, one row per answer (``image``, ``answer``, ``where``), to review."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["image", "answer", "where"])
    for disputed in outcome.disputes:
        writer.writerows([disputed.image, a.label, a.where] for a in disputed.answers)
    return buffer.getvalue()


def write_disputes(outcome: IngestOutcome, folder: Path) -> None:
    """``<batch folder>/disputes.csv`` with the batch's disputed images, or none once they are resolved."""
    disputes = folder / "disputes.csv"
    if outcome.disputes:
        write_text_atomically(disputes, disputes_csv(outcome))
    elif disputes.exists():
        disputes.unlink()  # resolved since the last ingest

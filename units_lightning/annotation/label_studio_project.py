"""The annotation project's one Label Studio project, with a Data Manager tab per batch.

The first ``select`` that sends a batch to a Label Studio server creates the project there (with a local file
storage on the project's ``tasks`` folder when the images are served as local files) and records it in
``label_studio.json`` beside ``labels.json``; every later ``select`` imports its batch into the same project. Every
task carries its batch in its data (``data.batch``), and every batch gets a tab of its own, a view filtered on
``data.batch`` and named by the batch id: a team opens one project and works tab by tab, with several batches out
at once. The labeling config is the same for every batch (``LABEL_CONFIG``): what differs between tasks, their
classes and support images, travels in the task data.

A batch's manifest records where it went, ``{"url", "project", "view", "tasks": {image: task id}}``: ``ingest``
exports only those tasks (an image that went back to the pool and came again in a later batch is another task of
the project, in that batch's tab), and cancelling the batch deletes the tasks of the query sets it gives up, and
its tab. Batches sent by older versions, one Label Studio project per batch (``{"url", "project"}``), are exported
whole, as they were then.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from units_lightning.annotation.answers import IMAGE_KEY
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import AnnotationBatch, utc_timestamp
from units_lightning.annotation.label_studio import (
    HINT_VACUITY,
    IMAGE_NAME,
    LabelStudio,
    LabelStudioError,
    check_image_served,
    label_studio_tasks,
)

__all__ = [
    "PROJECT_FILE",
    "LabelStudioProject",
    "batch_export",
    "batch_filter",
    "open_project",
    "read_project_record",
    "send_batch",
    "where_sent",
    "withdraw",
]

PROJECT_FILE = "label_studio.json"
PROJECT_FORMAT = "units-lightning label studio project 1"
_TITLE_LENGTH = 50  # Label Studio's limit on a project's title


@dataclass(frozen=True)
class LabelStudioProject:
    """The Label Studio project of an annotation project, as ``label_studio.json`` records it.

    Attributes:
        url: the server; project: the project's id there; title: its title there.
        created: when ``select`` created it (ISO 8601, UTC).
    """

    url: str
    project: int
    title: str
    created: str


def read_project_record(root: str | Path) -> LabelStudioProject | None:
    """The Label Studio project recorded in the annotation project ``root`` (its ``label_studio.json``), or None.

    Raises:
        ValueError: the file is not such a record (the message names it and what to do).
    """
    path = Path(root) / PROJECT_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != PROJECT_FORMAT:
            raise ValueError(f"its format is {data.get('format')!r}, expected {PROJECT_FORMAT!r}")
        return LabelStudioProject(str(data["url"]), int(data["project"]), str(data["title"]), str(data["created"]))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            f"cannot read {path}: {error}. Move it away: the next select creates a new Label Studio project (the "
            "batches pending in the old one are still fetched from it, their manifests name it)"
        ) from None


def _write_record(root: Path, record: LabelStudioProject) -> None:
    write_text_atomically(
        root / PROJECT_FILE, json.dumps({"format": PROJECT_FORMAT, **asdict(record)}, indent=1) + "\n"
    )


def batch_filter(batch_id: str) -> dict[str, Any]:
    """The Data Manager filter of a batch's tab: the tasks whose ``data.batch`` is ``batch_id``."""
    item = {"filter": "filter:tasks:data.batch", "operator": "equal", "type": "String", "value": batch_id}
    return {"conjunction": "and", "items": [item]}


def open_project(
    client: LabelStudio, root: str | Path, files_root: str | Path | None = None
) -> tuple[LabelStudioProject, bool]:
    """The annotation project's Label Studio project on ``client``'s server: the one ``label_studio.json`` records,
    else a new one, recorded.

    Args:
        client: the server.
        root: the annotation project's folder (where ``label_studio.json`` is).
        files_root: for a new project, the folder to connect as its local file storage (the project's ``tasks``
            folder); None when the images are served from elsewhere.

    Returns:
        The project, and whether it was created now.

    Raises:
        ValueError: the recorded project is on another server, or the record cannot be read.
        LabelStudioError: the recorded project is gone from the server, or a call failed.
    """
    root = Path(root)
    path = root / PROJECT_FILE
    record = read_project_record(root)
    if record is not None:
        if record.url.rstrip("/") != client.url:
            raise ValueError(
                f"the annotation project's batches go to Label Studio project {record.project} at {record.url} "
                f"({path}), not to {client.url}: pass --label_studio_url {record.url}, or move {path.name} away to "
                f"start a new Label Studio project at {client.url} (the batches pending at {record.url} are still "
                "fetched from there)"
            )
        try:
            client.project(record.project)
        except LabelStudioError as error:
            if error.status != 404:
                raise
            raise LabelStudioError(
                f"Label Studio project {record.project} at {record.url}, the annotation project's ({path}), is gone "
                f"(HTTP 404). Move {path.name} away and select again to create a new one; the batches pending in the "
                "old project cannot be fetched any more: give them up with select --cancel",
                404,
            ) from None
        return record, False
    title = root.name[:_TITLE_LENGTH]
    project = client.create_project(title)
    try:
        if files_root is not None:
            client.connect_local_files(project, files_root, f"{title} images"[:_TITLE_LENGTH])
        record = LabelStudioProject(client.url, project, title, utc_timestamp())
        _write_record(root, record)
    except (LabelStudioError, OSError) as error:
        try:
            client.delete_project(project)
        except LabelStudioError as cleanup:
            raise LabelStudioError(f"{error} (and project {project} could not be deleted: {cleanup})") from None
        raise LabelStudioError(f"{error}. Label Studio project {project} was deleted again") from None
    return record, True


def _undo(
    client: LabelStudio, root: Path, record: LabelStudioProject, created: bool, view: int | None, tasks: Mapping
) -> str:
    """Remove what ``send_batch`` made in Label Studio (the project when it made it, else the batch's tasks and
    tab); returns what was done, to end the error message with."""
    try:
        if created:
            client.delete_project(record.project)
            (root / PROJECT_FILE).unlink(missing_ok=True)
            return f"Label Studio project {record.project} was deleted again; nothing was written"
        if view is not None and not tasks:
            tasks = client.view_tasks(view)  # imported, but the server did not say which ids
        client.delete_tasks(record.project, list(tasks.values()))
        if view is not None:
            client.delete_view(view)
        return f"the batch's tasks and tab were removed from Label Studio project {record.project}; nothing was written"
    except LabelStudioError as cleanup:
        return (
            f"What it made in Label Studio project {record.project} could not be removed ({cleanup}): delete the tab "
            "and its tasks there. Nothing was written"
        )


def send_batch(
    batch: AnnotationBatch,
    client: LabelStudio,
    url: Callable[[str], str],
    files_root: str | Path | None = None,
    supports: Mapping[str, Sequence[Sequence[str]]] | None = None,
    hint_vacuity: float = HINT_VACUITY,
) -> AnnotationBatch:
    """Import the batch into the annotation project's Label Studio project (``open_project``: the first batch
    creates it), give it a tab of its own and check that an image loads through it; returns the batch recording
    where it went (``{"url", "project", "view", "tasks": {image: task id}}``).

    Args:
        batch: the batch to label.
        client: the Label Studio to send it to.
        url: the images' URLs (``image_urls``).
        files_root: when the images are served as local files, the folder a new project connects as its local file
            storage (the project's ``tasks`` folder); None when they are served from elsewhere.
        supports, hint_vacuity: see ``label_studio_tasks``.

    Raises:
        ValueError: see ``open_project``.
        LabelStudioError: a call failed, or the first image does not load. What this call made is removed again (the
            batch's tasks and tab; the project too when this batch created it), so that no tab of broken images is
            left behind.
    """
    root = Path(batch.project)
    record, created = open_project(client, root, files_root)
    view, tasks = None, {}
    try:
        view = client.create_view(record.project, batch.id, batch_filter(batch.id))
        imported = label_studio_tasks(batch, url, supports, hint_vacuity)
        ids = client.import_tasks(record.project, imported)
        images = [task["data"][IMAGE_KEY] for task in imported]
        tasks = dict(zip(images, ids, strict=True)) if ids is not None else client.view_tasks(view)
        if set(tasks) != set(images):
            raise LabelStudioError(
                f"the tab {batch.id} of Label Studio project {record.project} shows {len(tasks)} tasks, the batch has "
                f"{len(images)} images"
            )
        check_image_served(client, imported[0]["data"][IMAGE_NAME], batch.query_sets[0].images[0].file)
    except LabelStudioError as error:
        raise LabelStudioError(f"{error}. {_undo(client, root, record, created, view, tasks)}") from None
    return batch.sent_to({"url": client.url, "project": record.project, "view": view, "tasks": tasks})


def where_sent(batch: AnnotationBatch) -> dict[str, Any]:
    """Where the batch was sent, as its manifest records it (``AnnotationBatch.label_studio``).

    Raises:
        ValueError: the batch was not sent to Label Studio (the message says what to pass instead).
    """
    sent = batch.label_studio or {}
    if "project" not in sent or "url" not in sent:
        raise ValueError(
            f"batch {batch.id} was not sent to Label Studio: pass --answers (batch.csv filled in, or a Label Studio "
            "JSON export)"
        )
    return sent


def batch_export(batch: AnnotationBatch, client: LabelStudio) -> list[dict[str, Any]]:
    """The batch's tasks with their annotations (Label Studio's JSON export): the tasks its manifest records, those
    of them whose data still name the batch (Label Studio on SQLite gives the id of a deleted task to the next task
    it creates), or, for a batch an older version sent to a project of its own, that whole project.

    Raises:
        ValueError: the batch was not sent to Label Studio.
        LabelStudioError: the export failed.
    """
    sent = where_sent(batch)
    if sent.get("tasks") is None:
        return client.export(int(sent["project"]))
    exported = client.export(int(sent["project"]), list(sent["tasks"].values()))
    return [task for task in exported if task.get("data", {}).get("batch") == batch.id]


def withdraw(batch: AnnotationBatch, client: LabelStudio, given_up: Collection[str], keep_tab: bool) -> str:
    """Delete from Label Studio what annotators should no longer see of a cancelled batch: the tasks of the images
    ``given_up`` (its query sets not taken in) and, unless ``keep_tab`` (part of the batch was taken in: its tab
    keeps showing those tasks), the batch's tab. Never the project. A batch an older version sent to a project of
    its own keeps that project.

    Returns:
        What was done, for the command's output.

    Raises:
        LabelStudioError: a call failed.
    """
    sent = batch.label_studio or {}
    project = sent.get("project")
    if project is None:
        return "it was not sent to Label Studio"
    if sent.get("view") is None:
        return f"its Label Studio project {project} (one per batch, made by an older version) stays: delete it there"
    given_up = set(given_up)
    in_tab = client.view_tasks(int(sent["view"]))  # the batch's tasks now, not ids another task may have taken since
    tasks = [task for image, task in in_tab.items() if image in given_up]
    client.delete_tasks(int(project), tasks)
    if keep_tab:
        return (
            f"its {len(tasks)} task(s) not taken in were deleted from Label Studio project {project}; its tab keeps "
            "the tasks taken in"
        )
    client.delete_view(int(sent["view"]))
    return f"its {len(tasks)} task(s) and its tab were deleted from Label Studio project {project}"

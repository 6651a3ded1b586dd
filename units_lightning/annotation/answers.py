"""Annotators' answers read from a filled-in CSV or a Label Studio export, each remembering where it came from."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CANT_TELL", "Answer", "read_answers", "read_answers_csv", "read_label_studio_export"]

# The names the Label Studio project of a batch uses (units_lightning.annotation.label_studio writes them).
IMAGE_KEY = "image_id"
CHOICES_NAME = "label"
# The answer of a person who cannot tell the image's class (a choice of the labeling page, a value of the CSV).
CANT_TELL = "can't tell"


@dataclass(frozen=True)
class Answer:
    """One image's class as an annotator gave it.

    Attributes:
        image: the image's name in the project.
        label: the class name given.
        where: where the answer was read, for messages (``answers.csv line 7``, ``export.json task 12``).
    """

    image: str
    label: str
    where: str


def read_answers_csv(path: str | Path) -> list[Answer]:
    """Answers from a CSV with an ``image`` and a ``label`` column (``batch.csv`` filled in; other columns ignored).

    Rows whose ``label`` is empty are not answers (``ingest`` keeps their query sets pending); ``can't tell`` is
    one. Several rows may answer one image (several annotators: ``ingest``'s agreement rule decides).

    Raises:
        ValueError: the file lacks an ``image`` or a ``label`` column.
    """
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as file:
        reader = csv.DictReader(file)
        missing = [c for c in ("image", "label") if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path} has no {' and no '.join(repr(c) for c in missing)} column: answers need one row per image "
                f"with its name in 'image' and its class in 'label' (the batch's batch.csv, filled in)"
            )
        return [
            Answer(row["image"].strip(), row["label"].strip(), f"{path.name} line {reader.line_num}")
            for row in reader
            if (row.get("label") or "").strip()
        ]


def _choices(result: Sequence[dict[str, Any]]) -> list[str]:
    return [c for r in result if r.get("from_name") == CHOICES_NAME for c in r.get("value", {}).get("choices", [])]


def read_label_studio_export(tasks: Sequence[dict[str, Any]], source: str) -> list[Answer]:
    """Answers from Label Studio's JSON export of a batch's project (``exportType=JSON``, or ``JSON_MIN``).

    Every submitted annotation of a task is an answer, so several annotators give several answers, which
    ``ingest``'s agreement rule reconciles. A skipped annotation (Label Studio's Skip) is a "can't tell" answer.

    Args:
        tasks: the export, a list of tasks.
        source: the file or URL it came from, for messages.

    Raises:
        ValueError: a task does not carry the image name (``data.image_id``): not a batch's project.
    """
    if not isinstance(tasks, list):
        raise ValueError(f"{source} is not a Label Studio JSON export (a list of tasks)")
    answers = []
    for number, task in enumerate(tasks, start=1):
        data = task.get("data", task)  # JSON_MIN puts the data fields and the choice at the top level
        image = data.get(IMAGE_KEY)
        where = f"{source} task {task.get('id', number)}"
        if not image:
            raise ValueError(f"{where} has no {IMAGE_KEY!r}: export the Label Studio project that `select` created")
        if "annotations" in task:
            for annotation in task["annotations"]:
                at = f"{where} annotation {annotation.get('id', '?')}"
                if annotation.get("was_cancelled"):
                    answers.append(Answer(image, CANT_TELL, at + " (skipped)"))
                else:
                    answers += [Answer(image, label, at) for label in _choices(annotation.get("result", []))]
        elif CHOICES_NAME in task:
            answers.append(Answer(image, str(task[CHOICES_NAME]), where))
    return answers


def read_answers(path: str | Path) -> list[Answer]:
    """Answers from ``path``: a Label Studio JSON export (``.json``) or a CSV (anything else).

    Raises:
        ValueError: the file cannot be read as either (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no answers file at {path}")
    if path.suffix.lower() == ".json":
        try:
            tasks = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} is not valid JSON ({error}): export the project as JSON from Label Studio"
            ) from None
        return read_label_studio_export(tasks, path.name)
    return read_answers_csv(path)

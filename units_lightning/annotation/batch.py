"""An annotation batch: the query sets ``select`` chose, with the model's pre-annotations, as JSON and CSV.

``manifest.json`` is what ``ingest`` checks answers against; ``batch.csv`` is the same batch one image per row,
with an empty ``label`` column for people who label in a spreadsheet.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from units_lightning.annotation.atomic import write_text_atomically

__all__ = [
    "CSV_COLUMNS",
    "MANIFEST_FORMAT",
    "AnnotationBatch",
    "ImagePrediction",
    "SelectedQuerySet",
    "batch_csv",
    "read_manifest",
    "write_batch",
]

MANIFEST_FORMAT = "units-lightning annotation batch 1"
MANIFEST_NAME = "manifest.json"
CSV_NAME = "batch.csv"
CSV_COLUMNS = (
    "batch",
    "query_set",
    "task",
    "image",
    "file",
    "classes",
    "predicted",
    "confidence",
    "vacuity",
    "dissonance",
    "probabilities",
    "label",
)


@dataclass(frozen=True)
class ImagePrediction:
    """The model's pre-annotation of one image.

    Attributes:
        image: the image's name in the project (``tasks/<task>/unlabeled/<file>``).
        file: its absolute path.
        predicted: the class of highest expected probability.
        probabilities: ``{class: expected probability}`` (Dirichlet mean, ``alpha / S``).
        vacuity: ``N / S``: how little evidence the model has.
        dissonance: how much its evidence conflicts.
    """

    image: str
    file: str
    predicted: str
    probabilities: dict[str, float]
    vacuity: float
    dissonance: float


@dataclass(frozen=True)
class SelectedQuerySet:
    """A chosen query set of one task.

    Attributes:
        task: the task's name; classes: its class names (the choices of every image of the set).
        score: the set's acquisition score (the choosing sampler's ``score``: the margin by default, the task
            uncertainty ``lambda * vacuity + (1 - lambda) * dissonance`` for ``MultiQuerySampler``).
        vacuity, dissonance: the set's means.
        images: the pre-annotation of each image.
    """

    task: str
    classes: tuple[str, ...]
    score: float
    vacuity: float
    dissonance: float
    images: tuple[ImagePrediction, ...]


@dataclass(frozen=True)
class AnnotationBatch:
    """What ``select`` wrote and ``ingest`` checks answers against.

    Attributes:
        id: the batch id (``ingest`` refuses one it has taken in before).
        project: the project folder; labels: the label store the answers go into.
        created: when it was selected (ISO 8601, UTC).
        checkpoint: the model that chose it; step: that checkpoint's training step.
        sampler: the sampler whose rule chose it (its ``repr``); lam: lambda of the task uncertainty.
        label_budget: the project's budget of labeled query sets, or None.
        query_sets: the chosen query sets, most uncertain first.
        label_studio: where the batch was sent (``{"url": ..., "project": id}``), or None.
    """

    id: str
    project: str
    labels: str
    created: str
    checkpoint: str
    step: int
    sampler: str
    lam: float
    label_budget: int | None
    query_sets: tuple[SelectedQuerySet, ...]
    label_studio: dict[str, Any] | None = field(default=None)

    @property
    def images(self) -> dict[str, tuple[int, SelectedQuerySet]]:
        """``{image name: (query set number, query set)}`` of every image of the batch."""
        return {p.image: (i, s) for i, s in enumerate(self.query_sets) for p in s.images}

    def sent_to(self, label_studio: dict[str, Any]) -> AnnotationBatch:
        return replace(self, label_studio=dict(label_studio))

    def to_json(self) -> str:
        return json.dumps({"format": MANIFEST_FORMAT, **asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> AnnotationBatch:
        data = json.loads(text)
        if data.pop("format", None) != MANIFEST_FORMAT:
            raise ValueError(f"not an annotation batch manifest ({MANIFEST_FORMAT!r})")
        data["query_sets"] = tuple(
            SelectedQuerySet(
                **{**s, "classes": tuple(s["classes"]), "images": tuple(ImagePrediction(**p) for p in s["images"])}
            )
            for s in data["query_sets"]
        )
        return cls(**data)


def utc_timestamp() -> str:
    """Now, in UTC to the second (ISO 8601): the time every record of the annotation loop carries."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def batch_csv(batch: AnnotationBatch) -> str:
    """The batch as CSV, one image per row (``CSV_COLUMNS``), with an empty ``label`` column to fill in."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for number, query_set in enumerate(batch.query_sets):
        for p in query_set.images:
            writer.writerow(
                [
                    batch.id,
                    number,
                    query_set.task,
                    p.image,
                    p.file,
                    json.dumps(list(query_set.classes)),
                    p.predicted,
                    f"{p.probabilities[p.predicted]:.4f}",
                    f"{p.vacuity:.4f}",
                    f"{p.dissonance:.4f}",
                    json.dumps({c: round(v, 4) for c, v in p.probabilities.items()}),
                    "",
                ]
            )
    return buffer.getvalue()


def write_batch(batch: AnnotationBatch, folder: str | Path) -> Path:
    """Write ``manifest.json`` and ``batch.csv`` into ``folder`` (each atomically); returns the manifest's path."""
    folder = Path(folder)
    write_text_atomically(folder / CSV_NAME, batch_csv(batch))
    write_text_atomically(folder / MANIFEST_NAME, batch.to_json())
    return folder / MANIFEST_NAME


def read_manifest(path: str | Path) -> AnnotationBatch:
    """The batch of a ``manifest.json`` (or of the batch folder holding one).

    Raises:
        ValueError: no manifest there, or the file is not one (the message names it).
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise ValueError(
            f"no annotation batch manifest at {path}: pass the folder `select` wrote, or its {MANIFEST_NAME}"
        )
    try:
        return AnnotationBatch.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read the annotation batch manifest {path}: {error}") from error

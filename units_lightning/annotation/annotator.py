"""A simulated annotator for experiments and tests: answers from a held-out answer key, one batch at a time."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path

from units_lightning.annotation.answers import Answer
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import CSV_COLUMNS, AnnotationBatch, batch_csv

__all__ = ["SimulatedAnnotator"]


class SimulatedAnnotator:
    """Labels a batch the way a person would, from an answer key the model never sees.

    It reads the key at the images of the batch it is given and nowhere else (``answer_key[image]``, one lookup
    per image), so the round-based loop (fit, select, label, ingest, fit) runs unattended on data whose labels
    exist, and a key that records its lookups shows that no other label was read.

    Args:
        answer_key: ``{image name: class name}`` for the project's unlabeled images (a ``Mapping``: a dict, or
            anything that reads a label only when asked for it).
    """

    def __init__(self, answer_key: Mapping[str, str]):
        self.answer_key = answer_key

    def _label(self, image: str) -> str:
        try:
            return self.answer_key[image]
        except KeyError:
            raise ValueError(f"the answer key has no class for image {image!r}") from None

    def answer(self, batch: AnnotationBatch) -> list[Answer]:
        """One answer per image of ``batch``."""
        return [
            Answer(p.image, self._label(p.image), f"simulated annotator, batch {batch.id}")
            for query_set in batch.query_sets
            for p in query_set.images
        ]

    def fill_in_csv(self, batch: AnnotationBatch, path: str | Path) -> Path:
        """Write ``batch.csv`` with its ``label`` column filled in (what a person hands back); returns ``path``."""
        rows = list(csv.DictReader(io.StringIO(batch_csv(batch))))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "label": self._label(row["image"])})
        write_text_atomically(path, buffer.getvalue())
        return Path(path)

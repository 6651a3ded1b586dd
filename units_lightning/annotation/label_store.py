"""The label store: every answer taken back from annotators, by image, with the batches it came in.

One JSON file (``labels.json`` in the project folder by default) that grows by one batch per ``ingest``::

    {
      "format": "units-lightning label store 1",
      "ledger": {"budget": null, "query_sets": 8, "query_images": 40, ...},   # LabelLedger.state_dict()
      "batches": [{"id": "batch-001-3f9c2a1b", "ingested": "2026-05-01T10:12:00+00:00", "source": "...",
                   "query_sets": [{"task": "birds-1", "images": ["tasks/birds-1/unlabeled/0042.jpg", ...]}, ...]}],
      "labels": {"tasks/birds-1/unlabeled/0042.jpg": "wren", ...}
    }

It is written atomically (``write_text_atomically``): an interrupted ``ingest`` leaves the previous store whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from units_lightning.annotation.atomic import write_text_atomically

__all__ = ["FORMAT", "IngestedBatch", "LabelStore", "LabeledQuerySet"]

FORMAT = "units-lightning label store 1"


@dataclass(frozen=True)
class LabeledQuerySet:
    """A query set whose every image has a label: the unit that is selected, labeled and trained on."""

    task: str
    images: tuple[str, ...]


@dataclass(frozen=True)
class IngestedBatch:
    """One annotation batch taken into the store: its id, when, from which file, and its query sets."""

    id: str
    ingested: str
    source: str
    query_sets: tuple[LabeledQuerySet, ...]


@dataclass(frozen=True)
class LabelStore:
    """The labels of a project so far (immutable: ``with_batch`` returns a new store).

    Attributes:
        labels: ``{image name: class name}``.
        batches: the ingested batches, oldest first.
        ledger: the ``LabelLedger`` state that counts these labels (``{}`` before the first batch).
    """

    labels: Mapping[str, str] = field(default_factory=dict)
    batches: tuple[IngestedBatch, ...] = ()
    ledger: Mapping[str, Any] = field(default_factory=dict)

    def batch(self, batch_id: str) -> IngestedBatch | None:
        """The ingested batch ``batch_id``, or None."""
        return next((b for b in self.batches if b.id == batch_id), None)

    def batch_of(self, image: str) -> str | None:
        """The id of the first batch that labeled ``image``, or None."""
        return next((b.id for b in self.batches for s in b.query_sets if image in s.images), None)

    def query_sets(self, task: str) -> list[LabeledQuerySet]:
        """The labeled query sets of ``task``, in the order they were ingested."""
        return [s for b in self.batches for s in b.query_sets if s.task == task]

    def with_batch(self, batch: IngestedBatch, labels: Mapping[str, str], ledger: Mapping[str, Any]) -> LabelStore:
        """This store plus ``batch``: its labels added, the ledger replaced by ``ledger``."""
        return LabelStore({**self.labels, **labels}, (*self.batches, batch), dict(ledger))

    def to_json(self) -> str:
        batches = [
            {
                "id": b.id,
                "ingested": b.ingested,
                "source": b.source,
                "query_sets": [{"task": s.task, "images": list(s.images)} for s in b.query_sets],
            }
            for b in self.batches
        ]
        data = {"format": FORMAT, "ledger": dict(self.ledger), "batches": batches, "labels": dict(self.labels)}
        return json.dumps(data, indent=1) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the store to ``path`` atomically (the previous file stays whole if this is interrupted)."""
        write_text_atomically(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> LabelStore:
        """The store in ``path``; an empty store when the file does not exist yet.

        Raises:
            ValueError: the file is not a label store (the message names it).
        """
        path = Path(path)
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"its format is {data.get('format')!r}, expected {FORMAT!r}")
            batches = tuple(
                IngestedBatch(
                    b["id"],
                    b["ingested"],
                    b["source"],
                    tuple(LabeledQuerySet(s["task"], tuple(s["images"])) for s in b["query_sets"]),
                )
                for b in data["batches"]
            )
            return cls(dict(data["labels"]), batches, dict(data["ledger"]))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"cannot read the label store {path}: {error}. Restore it from a backup, or move it away to start "
                "with no labels"
            ) from error

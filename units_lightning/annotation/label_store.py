"""The label store: every answer taken back from annotators, by image, the batches it came in, and the batches out.

One JSON file (``labels.json`` in the project folder by default), written atomically (``write_text_atomically``):
an interrupted ``select`` or ``ingest`` leaves the previous store whole::

    {
      "format": "units-lightning label store 2",
      "ledger": {"budget": null, "query_sets": 8, "query_images": 40, ...},   # LabelLedger.state_dict()
      "selected": [{"id": "batch-002-8b661a9a", "folder": "/.../batches/batch-002-8b661a9a",
                    "selected": "2026-05-02T09:00:00+00:00", "cancelled": null,
                    "query_sets": [{"task": "birds-1", "images": [...]}, ...]}],           # every batch sent out
      "batches": [{"id": "batch-001-3f9c2a1b", "ingested": "2026-05-01T10:12:00+00:00", "source": "...",
                   "query_sets": [{"task": "birds-1", "images": ["tasks/birds-1/unlabeled/0042.jpg", ...]}, ...],
                   "removed": [{"task": "birds-2", "images": [...], "cant_tell": [...], "answers": {...}}]}],
      "labels": {"tasks/birds-1/unlabeled/0042.jpg": "wren", ...}
    }

A batch is pending from ``select`` until every one of its query sets is taken in (labeled, or removed because an
image of it could not be told) or the batch is cancelled; the images of pending query sets are not offered to a new
batch, so several batches can be out at once. ``ingest`` may take a batch in several parts: each part is one entry
of ``batches``. Stores of format 1 (no ``selected``, no ``removed``) are read as they are.

Commands that read the store, change it and write it back hold ``store_lock`` meanwhile (an exclusive lock on the
folder that holds ``labels.json``), so that two of them at once, ``serve`` ingesting after annotations and a person
running ``ingest`` or ``select``, never write over each other's change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from units_lightning.annotation.atomic import write_text_atomically

try:
    import fcntl
except ImportError:  # not POSIX: no lock between processes
    fcntl = None

__all__ = [
    "FORMAT",
    "IngestedBatch",
    "LabelStore",
    "LabeledQuerySet",
    "RemovedQuerySet",
    "SelectedBatch",
    "store_lock",
]

FORMAT = "units-lightning label store 2"
_READABLE = ("units-lightning label store 1", FORMAT)


@dataclass(frozen=True)
class LabeledQuerySet:
    """A query set whose every image has a label: the unit that is selected, labeled and trained on."""

    task: str
    images: tuple[str, ...]


@dataclass(frozen=True)
class RemovedQuerySet:
    """A query set taken out of its batch because people could not tell the class of some of its images.

    Attributes:
        task: its task; images: all its images.
        cant_tell: the images whose answer was "can't tell" (never offered again).
        answers: the agreed classes of its other images, kept (they are not trained on: a query set is labeled
            whole), so that no answer given is lost.
    """

    task: str
    images: tuple[str, ...]
    cant_tell: tuple[str, ...]
    answers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestedBatch:
    """One part of an annotation batch taken into the store: its id, when, from which file, its labeled query sets
    and the query sets it removed ("can't tell")."""

    id: str
    ingested: str
    source: str
    query_sets: tuple[LabeledQuerySet, ...]
    removed: tuple[RemovedQuerySet, ...] = ()


@dataclass(frozen=True)
class SelectedBatch:
    """A batch ``select`` sent out: its id, folder, when, its query sets, and when it was cancelled (or None)."""

    id: str
    folder: str
    selected: str
    query_sets: tuple[LabeledQuerySet, ...]
    cancelled: str | None = None


def _sets_json(sets) -> list[dict[str, Any]]:
    return [{"task": s.task, "images": list(s.images)} for s in sets]


def _sets(data) -> tuple[LabeledQuerySet, ...]:
    return tuple(LabeledQuerySet(s["task"], tuple(s["images"])) for s in data)


@dataclass(frozen=True)
class LabelStore:
    """The labels of a project so far (immutable: ``with_batch``, ``with_selected``, ``with_cancelled`` return a
    new store).

    Attributes:
        labels: ``{image name: class name}``.
        batches: the ingested batch parts, oldest first.
        ledger: the ``LabelLedger`` state that counts these labels (``{}`` before the first batch).
        selected: the batches ``select`` sent out, oldest first.
    """

    labels: Mapping[str, str] = field(default_factory=dict)
    batches: tuple[IngestedBatch, ...] = ()
    ledger: Mapping[str, Any] = field(default_factory=dict)
    selected: tuple[SelectedBatch, ...] = ()

    def batch(self, batch_id: str) -> IngestedBatch | None:
        """The first ingested part of batch ``batch_id``, or None."""
        return next((b for b in self.batches if b.id == batch_id), None)

    def batch_of(self, image: str) -> str | None:
        """The id of the first batch that labeled ``image``, or None."""
        return next((b.id for b in self.batches for s in b.query_sets if image in s.images), None)

    def query_sets(self, task: str) -> list[LabeledQuerySet]:
        """The labeled query sets of ``task``, in the order they were ingested."""
        return [s for b in self.batches for s in b.query_sets if s.task == task]

    def taken(self, batch_id: str) -> set[tuple[str, ...]]:
        """The query sets (their images) of batch ``batch_id`` already taken in: labeled or removed."""
        parts = [b for b in self.batches if b.id == batch_id]
        return {s.images for b in parts for s in b.query_sets} | {s.images for b in parts for s in b.removed}

    @property
    def cant_tell(self) -> dict[str, str]:
        """``{image: batch id}`` of every image people could not tell (it is not offered again)."""
        return {image: b.id for b in self.batches for s in b.removed for image in s.cant_tell}

    @property
    def removed(self) -> list[RemovedQuerySet]:
        """Every query set removed from its batch, in the order they were ingested."""
        return [s for b in self.batches for s in b.removed]

    def selected_batch(self, batch_id: str) -> SelectedBatch | None:
        """The batch ``batch_id`` as ``select`` sent it out, or None (a batch made in Python, or before format 2)."""
        return next((s for s in self.selected if s.id == batch_id), None)

    def pending_sets(self, batch: SelectedBatch) -> list[LabeledQuerySet]:
        """The query sets of ``batch`` not taken in yet (none once it is cancelled)."""
        if batch.cancelled:
            return []
        taken = self.taken(batch.id)
        return [s for s in batch.query_sets if s.images not in taken]

    def pending(self) -> list[SelectedBatch]:
        """The batches out: sent by ``select``, not cancelled, with query sets not taken in yet."""
        return [b for b in self.selected if self.pending_sets(b)]

    @property
    def unavailable(self) -> set[str]:
        """Images a new batch must not offer: labeled, could not be told, or in a pending query set."""
        out = {i for b in self.pending() for s in self.pending_sets(b) for i in s.images}
        return set(self.labels) | set(self.cant_tell) | out

    @property
    def batches_made(self) -> int:
        """How many batches the project has had (ingested or sent out): the next batch's number less one."""
        return len({b.id for b in self.batches} | {s.id for s in self.selected})

    def with_batch(self, batch: IngestedBatch, labels: Mapping[str, str], ledger: Mapping[str, Any]) -> LabelStore:
        """This store plus ``batch``: its labels added, the ledger replaced by ``ledger``."""
        return replace(self, labels={**self.labels, **labels}, batches=(*self.batches, batch), ledger=dict(ledger))

    def with_selected(self, batch: SelectedBatch) -> LabelStore:
        """This store with ``batch`` sent out.

        Raises:
            ValueError: a batch of that id was sent out or ingested before.
        """
        if self.selected_batch(batch.id) is not None or self.batch(batch.id) is not None:
            raise ValueError(f"the project has a batch {batch.id} already: choose another id")
        return replace(self, selected=(*self.selected, batch))

    def with_cancelled(self, batch_id: str, when: str) -> LabelStore:
        """This store with the pending batch ``batch_id`` cancelled: its query sets not taken in yet are given up
        (their images may be chosen again); the parts already ingested stay.

        Raises:
            ValueError: no such batch was sent out, or it is not pending (all taken in, or cancelled already).
        """
        out = self.selected_batch(batch_id)
        if out is None:
            known = ", ".join(s.id for s in self.selected) or "none"
            raise ValueError(f"no batch {batch_id} was sent out by select (the project's batches: {known})")
        if out.cancelled:
            raise ValueError(f"batch {batch_id} was cancelled already ({out.cancelled})")
        if not self.pending_sets(out):
            raise ValueError(f"batch {batch_id} is taken in whole: there is nothing left of it to cancel")
        selected = tuple(replace(s, cancelled=when) if s.id == batch_id else s for s in self.selected)
        return replace(self, selected=selected)

    def to_json(self) -> str:
        batches = [
            {
                "id": b.id,
                "ingested": b.ingested,
                "source": b.source,
                "query_sets": _sets_json(b.query_sets),
                "removed": [
                    {
                        "task": s.task,
                        "images": list(s.images),
                        "cant_tell": list(s.cant_tell),
                        "answers": dict(s.answers),
                    }
                    for s in b.removed
                ],
            }
            for b in self.batches
        ]
        selected = [
            {
                "id": s.id,
                "folder": s.folder,
                "selected": s.selected,
                "cancelled": s.cancelled,
                "query_sets": _sets_json(s.query_sets),
            }
            for s in self.selected
        ]
        data = {
            "format": FORMAT,
            "ledger": dict(self.ledger),
            "selected": selected,
            "batches": batches,
            "labels": dict(self.labels),
        }
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
            if data.get("format") not in _READABLE:
                raise ValueError(f"its format is {data.get('format')!r}, expected {FORMAT!r}")
            batches = tuple(
                IngestedBatch(
                    b["id"],
                    b["ingested"],
                    b["source"],
                    _sets(b["query_sets"]),
                    tuple(
                        RemovedQuerySet(s["task"], tuple(s["images"]), tuple(s["cant_tell"]), dict(s["answers"]))
                        for s in b.get("removed", [])
                    ),
                )
                for b in data["batches"]
            )
            selected = tuple(
                SelectedBatch(s["id"], s["folder"], s["selected"], _sets(s["query_sets"]), s.get("cancelled"))
                for s in data.get("selected", [])
            )
            return cls(dict(data["labels"]), batches, dict(data["ledger"]), selected)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"cannot read the label store {path}: {error}. Restore it from a backup, or move it away to start "
                "with no labels"
            ) from error


@contextmanager
def store_lock(path: str | Path) -> Iterator[None]:
    """Hold the label store ``path`` for one read, change and write (an exclusive lock on the folder that holds it,
    waited for; the store itself is replaced by every write, so it cannot carry the lock): another command that
    updates the store meanwhile waits, so neither writes over the other's change. A lock between processes on POSIX
    systems; elsewhere it does nothing."""
    folder = Path(path).parent
    if fcntl is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock

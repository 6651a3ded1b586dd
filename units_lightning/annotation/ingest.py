"""Taking answers back: check them against their batch, reconcile several annotators, count the complete query sets
in the ledger, add them to the label store, and keep the rest pending.

A query set is taken in when every image of it has an agreed class (``agreement``); it is removed from its batch
when people could not tell an image ("can't tell"), the answers of its other images kept; otherwise it stays
pending (answers missing, too few annotators, or a dispute) and a later ``ingest`` of the same batch takes it.
Every check runs before anything is written, and the store is written atomically, so a refused ``ingest`` leaves
the store as it was and an interrupted one leaves it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from units_lightning.annotation.agreement import Verdict, verdict
from units_lightning.annotation.answers import CANT_TELL, Answer
from units_lightning.annotation.batch import AnnotationBatch, SelectedQuerySet, utc_timestamp
from units_lightning.annotation.label_store import (
    IngestedBatch,
    LabeledQuerySet,
    LabelStore,
    RemovedQuerySet,
    store_lock,
)
from units_lightning.episode import SealedLabels, TaskBatch
from units_lightning.ledger import LabelLedger

__all__ = [
    "IngestError",
    "IngestOutcome",
    "check_answers",
    "count_in_ledger",
    "ingest",
    "ingest_answers",
    "take_in",
]

_SHOWN = 20  # problems listed in one message


class IngestError(ValueError):
    """Answers that cannot be taken in; the message lists every problem, naming the batch, the image and the file."""


def _listed(problems: list[str]) -> str:
    return "\n  - ".join(problems[:_SHOWN]) + (
        f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    )


def check_answers(batch: AnnotationBatch, answers: Sequence[Answer], store: LabelStore) -> dict[str, list[Answer]]:
    """The answers of every image of ``batch``, after checking each of them.

    Args:
        batch: the batch the answers are for.
        answers: the annotators' answers (several per image when several people answered).
        store: the labels taken in so far.

    Returns:
        ``{image name: its answers}`` for the images of the batch that have answers.

    Raises:
        IngestError: the batch was taken in whole before, or was cancelled; or an answer names an image that is not
            in the batch, or a class that is not one of its task's; or contradicts the class an earlier batch gave
            the image. Every problem is listed.
    """
    out = store.selected_batch(batch.id)
    if out is not None and out.cancelled:
        raise IngestError(
            f"batch {batch.id} was cancelled ({out.cancelled}); nothing was changed. Its images may be in newer "
            "batches: label those"
        )
    taken = store.taken(batch.id)
    if taken and all(s.images in taken for s in _sets(batch)):
        earlier = store.batch(batch.id)
        raise IngestError(
            f"batch {batch.id} was ingested already ({earlier.ingested}, from {earlier.source}); nothing was "
            "changed. Each batch is taken in once: select a new batch for more labels"
        )
    images = batch.images
    problems: list[str] = []
    given: dict[str, list[Answer]] = {}
    for answer in answers:
        if answer.image not in images:
            problems.append(f"{answer.where}: unknown image {answer.image!r}: it is not in batch {batch.id}")
            continue
        _, query_set = images[answer.image]
        if answer.label not in query_set.classes and answer.label != CANT_TELL:
            problems.append(
                f"{answer.where}: unknown class {answer.label!r} for image {answer.image!r}: task {query_set.task!r} "
                f"has the classes {', '.join(query_set.classes)} (or {CANT_TELL!r})"
            )
            continue
        before = store.labels.get(answer.image)
        earlier = store.batch_of(answer.image) if before is not None else None
        # An answer that contradicts another batch's label is refused; this batch's own parts were reconciled.
        if earlier is not None and earlier != batch.id and answer.label not in (before, CANT_TELL):
            problems.append(
                f"{answer.where}: image {answer.image!r} is labeled {answer.label!r}, but batch {earlier} labeled it "
                f"{before!r}"
            )
        given.setdefault(answer.image, []).append(answer)
    if problems:
        raise IngestError(
            f"batch {batch.id}: {len(problems)} problem(s); nothing was written:\n  - {_listed(problems)}"
        )
    return given


def _sets(batch: AnnotationBatch) -> list[LabeledQuerySet]:
    return [LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in batch.query_sets]


def count_in_ledger(
    sets: Sequence[SelectedQuerySet], labels: dict[str, str], ledger_state: dict, batch: AnnotationBatch
) -> tuple[dict[str, str], dict]:
    """Open the answers of the query sets ``sets`` through ``LabelLedger.reveal``, the one reader of query labels,
    which counts them.

    The answers travel sealed, as a training batch's query labels do: one row of ``n`` images per query set (the
    batch's support sets are not counted again), and the ledger refuses them when they exceed the project's label
    budget.

    Returns:
        The labels the ledger revealed, ``{image: class}``, and the ledger's new state.

    Raises:
        IngestError: the sets are more than are left of the label budget.
    """
    ledger = LabelLedger(batch.label_budget)
    if ledger_state:
        ledger.load_state_dict(ledger_state)
    if not sets:
        return {}, ledger.state_dict()
    positions = torch.tensor([[[s.classes.index(labels[p.image]) for p in s.images]] for s in sets])
    sealed = TaskBatch(
        support_x=torch.empty(len(sets), 0),
        support_y=torch.empty(len(sets), 0, dtype=torch.long),
        query_x=torch.empty(len(sets), 1, 0),
        query_y=SealedLabels(positions),
        classes=torch.empty(len(sets), 0, dtype=torch.long),
    )
    try:
        revealed = ledger.reveal(sealed, torch.ones(len(sets), 1, dtype=torch.bool)).labels
    except ValueError as error:
        raise IngestError(
            f"batch {batch.id} holds {len(sets)} query sets, more than is left of the label budget of "
            f"{batch.label_budget} ({ledger.query_sets} labeled already): {error}. Nothing was written"
        ) from None
    opened = {
        p.image: s.classes[int(c)]
        for s, row in zip(sets, revealed, strict=True)
        for p, c in zip(s.images, row, strict=True)
    }
    return opened, ledger.state_dict()


@dataclass(frozen=True)
class IngestOutcome:
    """What one ``ingest`` did with a batch.

    Attributes:
        store: the new label store (written by ``ingest``; not by ``take_in``).
        labeled: the query sets taken in with a class for every image.
        removed: the query sets removed from the batch because an image could not be told.
        pending: the query sets that stay pending, each with its images' verdicts (answers missing, too few
            annotators, or disputed).
        disputes: the images whose answers do not meet the agreement rule, with their answers: to review.
    """

    store: LabelStore
    labeled: tuple[SelectedQuerySet, ...]
    removed: tuple[RemovedQuerySet, ...]
    pending: tuple[SelectedQuerySet, ...]
    disputes: tuple[Verdict, ...]


def take_in(
    batch: AnnotationBatch,
    answers: Sequence[Answer],
    store: LabelStore,
    source: str,
    rule: str = "majority",
    annotators: int = 1,
) -> IngestOutcome:
    """The label store with what is complete of ``batch`` taken in (nothing is written: see ``ingest``).

    Args:
        batch: the batch; answers: every answer so far (earlier parts of the batch are not taken again).
        store: the label store; source: where the answers came from, recorded.
        rule: the agreement rule (``majority`` or ``unanimous``); annotators: answers wanted per image.

    Raises:
        IngestError: see ``check_answers`` and ``count_in_ledger``; or no query set of the batch is complete (the
            message lists what each is waiting for).
    """
    given = check_answers(batch, answers, store)
    taken = store.taken(batch.id)
    labeled, removed, pending, disputes = [], [], [], []
    classes: dict[str, str] = {}
    for query_set, images in zip(batch.query_sets, _sets(batch), strict=True):
        if images.images in taken:
            continue
        verdicts = [verdict(i, given.get(i, []), rule, annotators) for i in images.images]
        disputes += [v for v in verdicts if v.disputed]
        cant_tell = tuple(v.image for v in verdicts if v.label == CANT_TELL)
        if cant_tell:
            agreed = {v.image: v.label for v in verdicts if v.label not in (None, CANT_TELL)}
            removed.append(RemovedQuerySet(query_set.task, images.images, cant_tell, agreed))
        elif all(v.label is not None for v in verdicts):
            labeled.append(query_set)
            classes.update({v.image: v.label for v in verdicts})
        else:
            pending.append((query_set, verdicts))
    if not labeled and not removed:
        problems = []
        for query_set, verdicts in pending:
            missing = [v.image for v in verdicts if v.waiting]
            disputed = [v.image for v in verdicts if v.disputed]
            why = []
            if missing:
                why.append(
                    f"{len(missing)} image(s) without enough answers ({annotators} wanted): {', '.join(missing)}"
                )
            if disputed:
                why.append(f"{len(disputed)} disputed: {', '.join(disputed)}")
            problems.append(f"query set of task {query_set.task!r}: {'; '.join(why)}")
        raise IngestError(
            f"batch {batch.id}: no query set is complete yet ({len(pending)} pending); nothing was written. A query "
            f"set is taken in once every image has an agreed answer ({rule} of at least {annotators}):\n  - "
            f"{_listed(problems)}"
        )
    opened, ledger = count_in_ledger(labeled, classes, dict(store.ledger), batch)
    part = IngestedBatch(
        batch.id,
        utc_timestamp(),
        source,
        tuple(LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in labeled),
        tuple(removed),
    )
    return IngestOutcome(
        store.with_batch(part, opened, ledger),
        tuple(labeled),
        tuple(removed),
        tuple(s for s, _ in pending),
        tuple(disputes),
    )


def ingest_answers(batch: AnnotationBatch, answers: Sequence[Answer], store: LabelStore, source: str) -> LabelStore:
    """The label store with ``batch``'s complete query sets taken in (one answer wanted per image, the majority
    rule; nothing is written: see ``ingest``).

    Raises:
        IngestError: see ``take_in``.
    """
    return take_in(batch, answers, store, source).store


def ingest(
    batch: AnnotationBatch,
    answers: Sequence[Answer],
    source: str,
    labels_path: str | Path | None = None,
    rule: str = "majority",
    annotators: int = 1,
) -> LabelStore:
    """Check ``answers`` against ``batch``, take in its complete query sets, count them and add them to its label
    store, written atomically (``ingest_outcome`` also says what stays pending).

    Args:
        batch: the batch (``read_manifest``).
        answers: the annotators' answers (``read_answers``, ``SimulatedAnnotator.answer``).
        source: where the answers came from, recorded in the store.
        labels_path: the label store (default: the one the batch names).
        rule: the agreement rule (``majority`` or ``unanimous``); annotators: answers wanted per image.

    Returns:
        The new store (already saved).

    Raises:
        IngestError: the answers cannot be taken in; the store is unchanged.
    """
    return ingest_outcome(batch, answers, source, labels_path, rule, annotators).store


def ingest_outcome(
    batch: AnnotationBatch,
    answers: Sequence[Answer],
    source: str,
    labels_path: str | Path | None = None,
    rule: str = "majority",
    annotators: int = 1,
) -> IngestOutcome:
    """``ingest``, returning what was taken in, removed and left pending, and the disputes (the store is saved).

    Raises:
        IngestError: the answers cannot be taken in; the store is unchanged.
    """
    path = Path(labels_path or batch.labels)
    with store_lock(path):
        outcome = take_in(batch, answers, LabelStore.load(path), source, rule, annotators)
        outcome.store.save(path)
    return outcome

"""Taking answers back: check them against their batch, count them in the ledger, add them to the label store.

Every check runs before anything is written, and the store is written atomically, so a refused ``ingest`` leaves
the store as it was and an interrupted one leaves it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

from units_lightning.annotation.answers import Answer
from units_lightning.annotation.batch import AnnotationBatch
from units_lightning.annotation.label_store import IngestedBatch, LabeledQuerySet, LabelStore
from units_lightning.episode import SealedLabels, TaskBatch
from units_lightning.ledger import LabelLedger

__all__ = ["IngestError", "check_answers", "count_in_ledger", "ingest", "ingest_answers"]

_SHOWN = 20  # problems listed in one message


class IngestError(ValueError):
    """Answers that cannot be taken in; the message lists every problem, naming the batch, the image and the file."""


def check_answers(batch: AnnotationBatch, answers: Sequence[Answer], store: LabelStore) -> dict[str, str]:
    """The class of every image of ``batch``, after checking the answers.

    Args:
        batch: the batch the answers are for.
        answers: the annotators' answers (an image may appear more than once if every answer agrees).
        store: the labels taken in so far.

    Returns:
        ``{image name: class name}`` for every image of the batch.

    Raises:
        IngestError: the batch was ingested before; or an answer names an image that is not in the batch, or a
            class that is not one of its task's; or an image got two different answers (here, or here and in an
            earlier batch); or an image of the batch has no answer. Every problem is listed.
    """
    earlier = store.batch(batch.id)
    if earlier is not None:
        raise IngestError(
            f"batch {batch.id} was ingested already ({earlier.ingested}, from {earlier.source}); nothing was "
            "changed. Each batch is taken in once: select a new batch for more labels"
        )
    images = batch.images
    problems: list[str] = []
    given: dict[str, Answer] = {}
    for answer in answers:
        if answer.image not in images:
            problems.append(f"{answer.where}: unknown image {answer.image!r}: it is not in batch {batch.id}")
            continue
        _, query_set = images[answer.image]
        if answer.label not in query_set.classes:
            problems.append(
                f"{answer.where}: unknown class {answer.label!r} for image {answer.image!r}: task {query_set.task!r} "
                f"has the classes {', '.join(query_set.classes)}"
            )
            continue
        first = given.setdefault(answer.image, answer)
        if first.label != answer.label:
            problems.append(
                f"image {answer.image!r} is labeled twice with two answers: {first.label!r} ({first.where}) and "
                f"{answer.label!r} ({answer.where})"
            )
        before = store.labels.get(answer.image)
        if before is not None and before != answer.label and first is answer:
            problems.append(
                f"{answer.where}: image {answer.image!r} is labeled {answer.label!r}, but batch "
                f"{store.batch_of(answer.image)} labeled it {before!r}"
            )
    missing = [image for image in images if image not in given]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (f", ... ({len(missing)} in all)" if len(missing) > _SHOWN else "")
        problems.append(
            f"{len(missing)} of the {len(images)} images of batch {batch.id} have no answer: {shown}. A query set is "
            "labeled whole: finish them and export again"
        )
    if problems:
        listed = "\n  - ".join(problems[:_SHOWN]) + (
            f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        )
        raise IngestError(f"batch {batch.id}: {len(problems)} problem(s); nothing was written:\n  - {listed}")
    return {image: answer.label for image, answer in given.items()}


def count_in_ledger(batch: AnnotationBatch, labels: dict[str, str], ledger_state: dict) -> tuple[dict[str, str], dict]:
    """Open the answers through ``LabelLedger.reveal``, the one reader of query labels, which counts them.

    The answers travel sealed, as a training batch's query labels do: one row of ``n`` images per query set (the
    batch's support sets are not counted again), and the ledger refuses them when they exceed the project's label
    budget.

    Returns:
        The labels the ledger revealed, ``{image: class}``, and the ledger's new state.

    Raises:
        IngestError: the batch holds more query sets than are left of the label budget.
    """
    ledger = LabelLedger(batch.label_budget)
    if ledger_state:
        ledger.load_state_dict(ledger_state)
    sets = batch.query_sets
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


def ingest_answers(batch: AnnotationBatch, answers: Sequence[Answer], store: LabelStore, source: str) -> LabelStore:
    """The label store with ``batch``'s answers taken in (nothing is written: see ``ingest``).

    Raises:
        IngestError: see ``check_answers`` and ``count_in_ledger``.
    """
    labels, ledger = count_in_ledger(batch, check_answers(batch, answers, store), dict(store.ledger))
    ingested = IngestedBatch(
        batch.id,
        datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source,
        tuple(LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in batch.query_sets),
    )
    return store.with_batch(ingested, labels, ledger)


def ingest(
    batch: AnnotationBatch, answers: Sequence[Answer], source: str, labels_path: str | Path | None = None
) -> LabelStore:
    """Check ``answers`` against ``batch``, count them and add them to its label store, written atomically.

    Args:
        batch: the batch (``read_manifest``).
        answers: the annotators' answers (``read_answers``, ``SimulatedAnnotator.answer``).
        source: where the answers came from, recorded in the store.
        labels_path: the label store (default: the one the batch names).

    Returns:
        The new store (already saved).

    Raises:
        IngestError: the answers cannot be taken in; the store is unchanged.
    """
    path = Path(labels_path or batch.labels)
    store = ingest_answers(batch, answers, LabelStore.load(path), source)
    store.save(path)
    return store

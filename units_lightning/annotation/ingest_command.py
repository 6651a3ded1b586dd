"""``units-lightning ingest``: take an annotation batch's answers into the project's label store.

The answers come from the batch's CSV, a Label Studio export, or the Label Studio the batch was sent to; the
complete query sets are taken in and the disputed images written for review. Never loads Lightning (torch only,
for the ledger, and only after ``--help``). Also runnable as ``python -m units_lightning.annotation.commands
ingest ...``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from units_lightning.annotation.agreement import AGREEMENT_RULES
from units_lightning.annotation.answers import read_answers
from units_lightning.annotation.batch import AnnotationBatch, read_manifest
from units_lightning.annotation.command_common import TOKEN_VARIABLE, fetch_answers, shown, write_disputes

if TYPE_CHECKING:
    from units_lightning.annotation.ingest import IngestOutcome

__all__ = ["ingest_main"]


def _ingest_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="units-lightning ingest",
        description="Take an annotation batch's answers into the label store, after checking them (unknown images or "
        "classes, an image with two answers, a batch taken in twice: nothing is written).",
    )
    parser.add_argument("--batch", required=True, help="the batch's folder (or its manifest.json)")
    parser.add_argument(
        "--answers",
        default=None,
        help="batch.csv with the label column filled in (any CSV with image and label columns), or Label Studio's "
        "JSON export of the batch's project; default: fetch that export from the Label Studio the batch was sent to",
    )
    parser.add_argument("--labels", default=None, help="the label store (default: the one the batch names)")
    parser.add_argument(
        "--agreement",
        choices=AGREEMENT_RULES,
        default="majority",
        help="how several answers for an image make its class: more than half agree (majority) or all (unanimous)",
    )
    parser.add_argument(
        "--annotators", type=int, default=1, help="answers wanted per image before it counts (default 1)"
    )
    parser.add_argument("--label_studio_url", default=None, help="Label Studio to fetch from (default: the batch's)")
    parser.add_argument("--label_studio_token", default=None, help=f"API token (default ${TOKEN_VARIABLE})")
    return parser


def _ingest_report(batch: AnnotationBatch, outcome: IngestOutcome, labels: str, folder: Path) -> str:
    store, ledger = outcome.store, outcome.store.ledger
    images = sum(len(s.images) for s in outcome.labeled)
    lines = [
        f"units-lightning ingest: batch {batch.id}, {len(outcome.labeled)} query sets ({images} images) into "
        f"{shown(labels)}"
    ]
    if outcome.removed:
        cant = sum(len(s.cant_tell) for s in outcome.removed)
        lines.append(
            f"  {len(outcome.removed)} query set(s) removed: {cant} image(s) could not be told (never offered again; "
            f"the project has {len(store.cant_tell)})"
        )
    if outcome.pending:
        lines.append(
            f"  {len(outcome.pending)} query set(s) still pending (answers missing or disputed): ingest the batch "
            "again once they are answered"
        )
    if outcome.disputes:
        lines.append(f"  {len(outcome.disputes)} disputed image(s) to review: {shown(folder / 'disputes.csv')}")
    budget = f" of a budget of {batch.label_budget}" if batch.label_budget else ""
    batches = len({b.id for b in store.batches})
    lines.append(
        f"  the project has {ledger.get('query_sets', 0)} labeled query sets ({ledger.get('query_images', 0)} images)"
        f"{budget} from {batches} batch{'es' if batches != 1 else ''}; train on them with units-lightning fit "
        "(docs/ANNOTATION.md)"
    )
    return "\n".join(lines)


def ingest_main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning ingest --batch FOLDER [--answers FILE] [--agreement RULE] [--annotators N]``.

    Takes in the batch's complete query sets, removes those with an image people could not tell, and keeps the
    rest pending (a later ``ingest`` of the batch takes them); the disputed images are written to
    ``<batch folder>/disputes.csv``.

    Raises:
        ValueError: the manifest or the answers cannot be read; ``IngestError`` (a ``ValueError``): the answers
            cannot be taken in (nothing is written).
        LabelStudioError: fetching the export failed.
    """
    parser = _ingest_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    from units_lightning.annotation.ingest import ingest_outcome  # with torch (the ledger), after --help

    batch = read_manifest(args.batch)
    folder = Path(args.batch) if Path(args.batch).is_dir() else Path(args.batch).parent
    if args.answers:
        answers, source = read_answers(args.answers), str(Path(args.answers).resolve())
    else:
        answers, source = fetch_answers(batch, folder, args.label_studio_url, args.label_studio_token)
    labels = args.labels or batch.labels
    outcome = ingest_outcome(batch, answers, source, labels, args.agreement, args.annotators)
    write_disputes(outcome, folder)
    print(_ingest_report(batch, outcome, labels, folder), flush=True)

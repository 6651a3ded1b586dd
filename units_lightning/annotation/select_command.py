"""``units-lightning select``: choose the next annotation batch of a project of tasks.

Reads the config that ``fit`` trained with (its ``data`` section an ``AnnotatedTasksDataModule``) and a checkpoint,
scores candidate query sets and writes the next batch, sent to Label Studio or as its import files. Also runnable
as ``python -m units_lightning.annotation.commands select ...``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from units_lightning.annotation.batch import MANIFEST_NAME, AnnotationBatch, read_manifest, utc_timestamp, write_batch
from units_lightning.annotation.command_common import TOKEN_VARIABLE, api_token, restore, shown
from units_lightning.annotation.help import full_help_words, short_help
from units_lightning.annotation.label_store import LabeledQuerySet, LabelStore, SelectedBatch, store_lock
from units_lightning.annotation.label_studio import (
    DOCUMENT_ROOT_VARIABLE,
    HINT_VACUITY,
    LabelStudio,
    LabelStudioError,
    document_root,
    image_urls,
    write_import_files,
)
from units_lightning.annotation.label_studio_project import send_batch, withdraw

# The model, the data and the parser that reads a config (torch, Lightning, jsonargparse) are imported when the
# command runs: `select --help` imports nothing of them.
if TYPE_CHECKING:
    from jsonargparse import ArgumentParser

    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
    from units_lightning.samplers import MarginSampler, TaskSampler

__all__ = ["default_acquisition", "select_main", "select_parser"]

# Sections of a fit config that select does not use (the trainer, the CLI's own options).
_NOT_USED = (
    "trainer",
    "seed_everything",
    "optimizer",
    "lr_scheduler",
    "prediction",
    "collapse",
    "dashboard_callbacks",
    "compile_for_next_run",
    "progress",
)


def select_parser() -> ArgumentParser:
    """select's parser: the model and data sections of a fit config, the checkpoint and the batch's options
    (``serve`` starts from it)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from units_lightning.data.episodic import EpisodicDataModule
    from units_lightning.module import UnitsMAML
    from units_lightning.samplers import TaskSampler

    parser = ArgumentParser(
        prog="units-lightning select",
        description="Choose the next annotation batch: adapt to each task's support set, score candidate query sets "
        "of its unlabeled images by the configured sampler's rule, and write the most informative as batch.csv and "
        "manifest.json (with the model's predictions as pre-annotations), and as a Label Studio project or its import "
        "files.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="the config fit trained with")
    parser.add_class_arguments(UnitsMAML, "model", skip={"sampler", "ensemble"})
    parser.add_subclass_arguments(EpisodicDataModule, "data", required=True)
    parser.link_arguments("data.n_way", "model.n_way", apply_on="instantiate")
    parser.link_arguments("data.image_shape", "model.image_shape", apply_on="instantiate")
    for name in _NOT_USED:
        parser.add_argument(f"--{name}", type=Any, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--ckpt_path",
        type=str | None,
        default=None,
        help="the checkpoint that chooses (fit's last.ckpt); without one (a new project) the batch is random",
    )
    parser.add_argument("--budget", type=int, required=True, help="query sets to choose for this batch")
    parser.add_subclass_arguments(
        TaskSampler,
        "acquisition",
        required=False,
        help="the acquisition that scores and chooses, a sampler by class_path (e.g. "
        "units_lightning.samplers.MultiQuerySampler for the paper's Units score; default: MarginSampler with the "
        "config's data.sampler tasks and query sets, the labeling-time winner in docs/RESULTS.md); random without "
        "--ckpt_path",
    )
    parser.add_argument("--output", type=str, default=None, help="the batch's folder (default <root>/batches/<id>)")
    parser.add_argument("--batch_id", type=str, default=None, help="the batch's id (default batch-<n>-<hash>)")
    parser.add_argument("--label_budget", type=int, default=None, help="the project's budget of labeled query sets")
    parser.add_argument("--device", type=str, default="cpu", help="where to score (cpu, cuda, cuda:1, ...)")
    parser.add_argument(
        "--label_studio_url",
        type=str,
        default=None,
        help="send the batch there (API): into the project's Label Studio project, created by the first batch, with "
        "a tab of its own",
    )
    parser.add_argument("--label_studio_token", type=str, default=None, help=f"API token (default ${TOKEN_VARIABLE})")
    parser.add_argument(
        "--label_studio_files_root",
        type=str,
        default=None,
        help=f"the folder Label Studio serves local files from, its {DOCUMENT_ROOT_VARIABLE} (default: that "
        "variable of this shell, else the project folder); select checks that an image loads",
    )
    parser.add_argument("--image_url_prefix", type=str, default=None, help="serve images from this URL instead")
    parser.add_argument(
        "--hint_vacuity",
        type=float,
        default=HINT_VACUITY,
        help="pre-select the model's class only for images whose vacuity is below this (above: a hint only)",
    )
    parser.add_argument(
        "--cancel",
        type=list[str],
        default=[],
        help="give up these pending batches first (their query sets not ingested yet go back to the pool)",
    )
    parser.add_argument(
        "--alongside",
        type=bool,
        default=False,
        help="select a new batch while others are pending (their images are left out of it)",
    )
    return parser


def _report(batch: AnnotationBatch, folder: Path, where: str) -> str:
    sets, images = len(batch.query_sets), sum(len(s.images) for s in batch.query_sets)
    scores = [s.score for s in batch.query_sets]
    chosen_by = (
        f"chosen by {batch.sampler} at step {batch.step}, lambda {batch.lam:.3f}; acquisition scores "
        f"{max(scores):.4f} .. {min(scores):.4f}"
        if batch.checkpoint
        else "chosen at random: no checkpoint yet (the first batch of a project)"
    )
    return "\n".join(
        [
            f"units-lightning select: batch {batch.id}, {sets} query sets ({images} images) of "
            f"{len({s.task for s in batch.query_sets})} tasks",
            f"  {chosen_by}",
            f"  written to {shown(folder)}/batch.csv and manifest.json; {where}",
            f"  next: label it, then units-lightning ingest --batch {shown(folder)}"
            + ("" if batch.label_studio else " --answers <batch.csv with its label column filled in>"),
        ]
    )


def _send(batch: AnnotationBatch, config: Any, folder: Path) -> tuple[AnnotationBatch, str]:
    """Send the batch into the project's Label Studio project (with a URL) or write its import files; returns the
    batch and where it went."""
    from units_lightning.annotation.layout import TASKS_FOLDER, load_project

    urls = image_urls(batch.project, document_root(config.label_studio_files_root), config.image_url_prefix)
    supports = {task.name: task.support for task in load_project(batch.project).tasks}
    if config.label_studio_url:
        token = api_token(config.label_studio_token)
        files = None if config.image_url_prefix else Path(batch.project) / TASKS_FOLDER
        client = LabelStudio(config.label_studio_url, token)
        batch = send_batch(batch, client, urls, files, supports, config.hint_vacuity)
        sent = batch.label_studio
        return batch, f"Label Studio project {sent['project']} at {sent['url']}, in its tab {batch.id}"
    written = write_import_files(batch, folder / "label_studio", urls, supports, config.hint_vacuity)
    return batch, f"Label Studio import files {', '.join(p.name for p in written)} in {shown(folder / 'label_studio')}"


def default_acquisition(sampler: TaskSampler) -> MarginSampler:
    """What ``select`` chooses by when no ``--acquisition`` is given: the margin of the expected probabilities, which
    saved the most labels on the validation classes of every labeling-time setting measured (docs/RESULTS.md,
    "Selection: which acquisition saves labels"), with the config sampler's tasks and candidate query sets."""
    from units_lightning.samplers import MarginSampler

    return MarginSampler(tasks=sampler.tasks, query_sets=sampler.query_sets)


def select_main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning select --config CONFIG [--ckpt_path CKPT] --budget K [options]``.

    Raises:
        ValueError: the config's data is not an annotation project, the checkpoint does not fit the model, the
            project's tasks do not fit the episode shape, nothing is left to choose, or the label budget is spent.
        LabelStudioError: a Label Studio call failed.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    page = short_help("select", words)
    if page is not None:  # the options people change, before the parser imports torch and Lightning
        print(page)
        return
    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
    from units_lightning.annotation.selection import select_batch
    from units_lightning.samplers import RandomSampler

    parser = select_parser()
    config = parser.parse_args(full_help_words(words))
    built = parser.instantiate(config)
    data, model = built.data, built.model
    if not isinstance(data, AnnotatedTasksDataModule):
        raise ValueError(
            "select needs a project of tasks with unlabeled images: data.class_path "
            f"units_lightning.annotation.AnnotatedTasksDataModule, not {type(data).__name__}"
        )
    model.sampler = data.sampler
    _cancel_and_check_pending(data, config)
    step, lam = restore(model, config.ckpt_path)
    batch = select_batch(
        model.to(config.device),
        data,
        config.budget,
        step=step,
        lam=lam,
        checkpoint=str(Path(config.ckpt_path).resolve()) if config.ckpt_path else "",
        label_budget=config.label_budget,
        batch_id=config.batch_id,
        sampler=(built.acquisition or default_acquisition(data.sampler)) if config.ckpt_path else RandomSampler(),
    )
    folder = Path(config.output) if config.output else Path(batch.project) / "batches" / batch.id
    store = data.label_store()
    if (folder / MANIFEST_NAME).exists() or store.selected_batch(batch.id) or store.batch(batch.id):
        raise ValueError(
            f"the project has a batch {batch.id} already ({shown(folder)}); a batch is never overwritten: pass "
            "another --batch_id or --output, or ingest or --cancel that batch"
        )
    batch, where = _send(batch, config, folder)
    write_batch(batch, folder)
    out = SelectedBatch(
        batch.id,
        str(folder.resolve()),
        batch.created,
        tuple(LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in batch.query_sets),
    )
    with store_lock(data.labels):  # read again: serve may have ingested meanwhile
        LabelStore.load(data.labels).with_selected(out).save(data.labels)
    print(_report(batch, folder, where), flush=True)


def _cancel_and_check_pending(data: AnnotatedTasksDataModule, config: Any) -> None:
    """Cancel the batches of ``--cancel`` (the store saved), then refuse to select while batches are pending,
    unless ``--alongside``.

    Raises:
        ValueError: a batch to cancel is unknown or not pending; batches are pending and ``--alongside`` is off
            (the message names them and the choices).
    """
    if config.cancel:
        with store_lock(data.labels):
            before = store = data.label_store()
            for batch_id in config.cancel:
                store = store.with_cancelled(batch_id, utc_timestamp())
            store.save(data.labels)
        print(f"units-lightning select: cancelled {', '.join(config.cancel)}", flush=True)
        for batch_id in config.cancel:
            print(f"  {batch_id}: {_withdraw(before.selected_batch(batch_id), before, config)}", flush=True)
    store = data.label_store()
    pending = store.pending()
    if pending and not config.alongside:
        listed = "; ".join(
            f"{b.id} ({len(store.pending_sets(b))} of {len(b.query_sets)} query sets not ingested, {shown(b.folder)})"
            for b in pending
        )
        raise ValueError(
            f"{len(pending)} batch(es) pending: {listed}. Nothing was selected. Ingest it (units-lightning ingest "
            f"--batch <folder>), or select another batch beside it with --alongside true (its images are left "
            f"out), or give it up with --cancel {pending[0].id}"
        )


def _withdraw(out: SelectedBatch, store: LabelStore, config: Any) -> str:
    """Take a cancelled batch's query sets not taken in out of Label Studio (``withdraw``); returns what was done,
    or, when Label Studio cannot be reached, what to delete there by hand (the batch is cancelled either way)."""
    try:
        batch = read_manifest(out.folder)
    except ValueError as error:
        return f"its manifest cannot be read, so nothing was deleted in Label Studio ({error})"
    sent = batch.label_studio or {}
    given_up = {image for s in store.pending_sets(out) for image in s.images}
    try:
        client = LabelStudio(config.label_studio_url or sent.get("url", ""), api_token(config.label_studio_token))
        return withdraw(batch, client, given_up, keep_tab=bool(store.taken(out.id)))
    except (ValueError, LabelStudioError) as error:
        if not sent.get("project"):
            return "it was not sent to Label Studio"
        return (
            f"its tasks could not be deleted from Label Studio project {sent['project']} ({error}): delete its tab "
            f"{out.id} and the tasks in it there"
        )

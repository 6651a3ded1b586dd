"""``units-lightning select`` and ``units-lightning ingest``: one round of labeling with people in the loop.

``select`` reads the config that ``fit`` trained with (its ``data`` section an ``AnnotatedTasksDataModule``) and a
checkpoint, and writes the next annotation batch; ``ingest`` takes the answers back into the label store. Also
runnable as ``python -m units_lightning.annotation.commands select ...``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from units_lightning.annotation.agreement import AGREEMENT_RULES
from units_lightning.annotation.answers import Answer, read_answers, read_label_studio_export
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import MANIFEST_NAME, AnnotationBatch, read_manifest, write_batch
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
from units_lightning.annotation.label_studio_project import (
    batch_export,
    read_project_record,
    send_batch,
    where_sent,
    withdraw,
)

# The model, the data and the parser that reads a config (torch, Lightning, jsonargparse) are imported by the
# commands that use them: `ingest` needs none of them (torch only, for the ledger), `select --help` nothing at all.
if TYPE_CHECKING:
    from jsonargparse import ArgumentParser

    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
    from units_lightning.annotation.ingest import IngestOutcome
    from units_lightning.module import UnitsMAML
    from units_lightning.samplers import MarginSampler, TaskSampler

__all__ = [
    "disputes_csv",
    "finished_epochs",
    "ingest_main",
    "main",
    "retrain_once",
    "schedule_at",
    "select_main",
    "serve_main",
]

TOKEN_VARIABLE = "LABEL_STUDIO_API_KEY"
NEXT_EPOCH = "{next_epoch}"  # in serve's --train_command: the epochs the served checkpoint finished, plus one
# Sections of a fit config that select does not use (the trainer, the CLI's own options).
_NOT_USED = ("trainer", "seed_everything", "optimizer", "lr_scheduler", "prediction", "collapse", "dashboard_callbacks")


def schedule_at(model: UnitsMAML, checkpoint: dict[str, Any]) -> tuple[int, float]:
    """The training step of ``checkpoint`` and the lambda its run scored with then (``UnitsMAML.schedule_epoch``:
    steps over ``schedule_steps_per_epoch`` when set, else the trainer's epoch)."""
    step = int(checkpoint.get("global_step", 0))
    epoch = (
        step / model.schedule_steps_per_epoch if model.schedule_steps_per_epoch else float(checkpoint.get("epoch", 0))
    )
    return step, float(model.lam(epoch))


def _select_parser() -> ArgumentParser:
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


def _shown(path: str | Path) -> str:
    """``path`` relative to the working folder when it lies inside it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
            f"  written to {_shown(folder)}/batch.csv and manifest.json; {where}",
            f"  next: label it, then units-lightning ingest --batch {_shown(folder)}"
            + ("" if batch.label_studio else " --answers <batch.csv with its label column filled in>"),
        ]
    )


def _restore(model: UnitsMAML, ckpt_path: str | None) -> tuple[int, float]:
    """Load ``ckpt_path``'s weights into ``model`` (weights only, shapes checked); returns its step and lambda."""
    from units_lightning.evaluation.checkpoints import load_checkpoint

    if ckpt_path is None:
        return 0, float(model.lam(0.0))
    checkpoint = load_checkpoint(ckpt_path, leave_out="pass another --ckpt_path")
    model.on_load_checkpoint(checkpoint)  # shapes checked, the ledger restored
    model.load_state_dict(checkpoint["state_dict"])
    return schedule_at(model, checkpoint)


def _send(batch: AnnotationBatch, config: Any, folder: Path) -> tuple[AnnotationBatch, str]:
    """Send the batch into the project's Label Studio project (with a URL) or write its import files; returns the
    batch and where it went."""
    from units_lightning.annotation.layout import TASKS_FOLDER, load_project

    urls = image_urls(batch.project, document_root(config.label_studio_files_root), config.image_url_prefix)
    supports = {task.name: task.support for task in load_project(batch.project).tasks}
    if config.label_studio_url:
        token = config.label_studio_token or os.environ.get(TOKEN_VARIABLE, "")
        files = None if config.image_url_prefix else Path(batch.project) / TASKS_FOLDER
        client = LabelStudio(config.label_studio_url, token)
        batch = send_batch(batch, client, urls, files, supports, config.hint_vacuity)
        sent = batch.label_studio
        return batch, f"Label Studio project {sent['project']} at {sent['url']}, in its tab {batch.id}"
    written = write_import_files(batch, folder / "label_studio", urls, supports, config.hint_vacuity)
    return batch, f"Label Studio import files {', '.join(p.name for p in written)} in {_shown(folder / 'label_studio')}"


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

    parser = _select_parser()
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
    step, lam = _restore(model, config.ckpt_path)
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
            f"the project has a batch {batch.id} already ({_shown(folder)}); a batch is never overwritten: pass "
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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
                store = store.with_cancelled(batch_id, _now())
            store.save(data.labels)
        print(f"units-lightning select: cancelled {', '.join(config.cancel)}", flush=True)
        for batch_id in config.cancel:
            print(f"  {batch_id}: {_withdraw(before.selected_batch(batch_id), before, config)}", flush=True)
    store = data.label_store()
    pending = store.pending()
    if pending and not config.alongside:
        listed = "; ".join(
            f"{b.id} ({len(store.pending_sets(b))} of {len(b.query_sets)} query sets not ingested, {_shown(b.folder)})"
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
        client = LabelStudio(config.label_studio_url or sent.get("url", ""), _token(config.label_studio_token))
        return withdraw(batch, client, given_up, keep_tab=bool(store.taken(out.id)))
    except (ValueError, LabelStudioError) as error:
        if not sent.get("project"):
            return "it was not sent to Label Studio"
        return (
            f"its tasks could not be deleted from Label Studio project {sent['project']} ({error}): delete its tab "
            f"{out.id} and the tasks in it there"
        )


def _token(given: str | None) -> str:
    return given or os.environ.get(TOKEN_VARIABLE, "")


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


def _fetch(batch: AnnotationBatch, folder: Path, url: str | None, token: str | None) -> tuple[list[Answer], str]:
    """The answers of the batch's tasks in Label Studio, fetched through the API (``batch_export``; the export is
    kept in ``<batch folder>/label_studio/export.json``)."""
    sent = where_sent(batch)
    client = LabelStudio(url or sent["url"], _token(token))
    source = f"{client.url} project {sent['project']}"
    export = batch_export(batch, client)
    write_text_atomically(folder / "label_studio" / "export.json", json.dumps(export, indent=1) + "\n")
    return read_label_studio_export(export, source), source


def disputes_csv(outcome: IngestOutcome) -> str:
    """The disputed images, one row per answer (``image``, ``task``, ``answer``, ``where``), to review."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["image", "answer", "where"])
    for disputed in outcome.disputes:
        writer.writerows([disputed.image, a.label, a.where] for a in disputed.answers)
    return buffer.getvalue()


def _ingest_report(batch: AnnotationBatch, outcome: IngestOutcome, labels: str, folder: Path) -> str:
    store, ledger = outcome.store, outcome.store.ledger
    images = sum(len(s.images) for s in outcome.labeled)
    lines = [
        f"units-lightning ingest: batch {batch.id}, {len(outcome.labeled)} query sets ({images} images) into "
        f"{_shown(labels)}"
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
        lines.append(f"  {len(outcome.disputes)} disputed image(s) to review: {_shown(folder / 'disputes.csv')}")
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
        answers, source = _fetch(batch, folder, args.label_studio_url, args.label_studio_token)
    labels = args.labels or batch.labels
    outcome = ingest_outcome(batch, answers, source, labels, args.agreement, args.annotators)
    _write_disputes(outcome, folder)
    print(_ingest_report(batch, outcome, labels, folder), flush=True)


def _write_disputes(outcome: IngestOutcome, folder: Path) -> None:
    """``<batch folder>/disputes.csv`` with the batch's disputed images, or none once they are resolved."""
    disputes = folder / "disputes.csv"
    if outcome.disputes:
        write_text_atomically(disputes, disputes_csv(outcome))
    elif disputes.exists():
        disputes.unlink()  # resolved since the last ingest


def _serve_parser() -> ArgumentParser:
    parser = _select_parser()
    parser.prog = "units-lightning serve"
    parser.description = (
        "A model server for Label Studio's ML backend API (/health, /setup, /predict, /webhook and /train): "
        "predictions with score, vacuity and dissonance for the tasks select sent, and, debounced after "
        "annotations, the answers ingested from Label Studio and --train_command run, then the checkpoint reloaded."
    )
    for action in list(parser._actions):  # select's own options that a server does not take
        if action.dest in ("budget", "output", "batch_id", "cancel", "alongside", "image_url_prefix"):
            parser._actions.remove(action)
            for option in action.option_strings:
                parser._option_string_actions.pop(option, None)
    parser.add_argument("--host", type=str, default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=9090, help="port to listen on (Label Studio: Settings > Model)")
    parser.add_argument("--debounce", type=float, default=30.0, help="seconds of quiet after annotations to retrain")
    parser.add_argument(
        "--train_command",
        type=str,
        default=None,
        help='the fit to run after new answers are ingested, e.g. "units-lightning fit --config ... --ckpt_path '
        f'last --trainer.max_epochs {NEXT_EPOCH}" ({NEXT_EPOCH}: the epochs --ckpt_path has finished, plus one: '
        "one more epoch at every retraining); it must write --ckpt_path, which is reloaded (none: ingest only)",
    )
    parser.add_argument(
        "--agreement",
        type=str,
        choices=AGREEMENT_RULES,
        default="majority",
        help="how several answers for an image make its class when the server ingests (as ingest --agreement)",
    )
    parser.add_argument(
        "--annotators", type=int, default=1, help="answers wanted per image before it counts (as ingest --annotators)"
    )
    return parser


def finished_epochs(checkpoint: dict[str, Any]) -> int:
    """How many epochs the run of ``checkpoint`` has finished: those its fit loop processed (a checkpoint saved at an
    epoch's end counts that epoch; one saved within an epoch, on SIGTERM, does not)."""
    try:
        return int(checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])
    except (KeyError, TypeError):
        return int(checkpoint.get("epoch", -1)) + 1


def _train_command(config: Any) -> list[str]:
    """``config.train_command`` as arguments, ``{next_epoch}`` replaced by ``finished_epochs`` of the served
    checkpoint plus one."""
    from units_lightning.evaluation.checkpoints import load_checkpoint

    words = shlex.split(config.train_command)
    if any(NEXT_EPOCH in word for word in words):
        checkpoint = load_checkpoint(config.ckpt_path, leave_out="pass another --ckpt_path")
        words = [word.replace(NEXT_EPOCH, str(finished_epochs(checkpoint) + 1)) for word in words]
    return words


def retrain_once(data: AnnotatedTasksDataModule, config: Any, reload: Any) -> list[str]:
    """One retraining: every pending batch sent to Label Studio is fetched and ingested (what is complete, by
    ``config.agreement`` of ``config.annotators`` answers; the disputes written to the batch's ``disputes.csv``), then,
    when something new was taken in, ``config.train_command`` runs (``_train_command``) and ``reload()`` loads the
    checkpoint again.

    Returns:
        What happened, one line per step (the server prints them).
    """
    from units_lightning.annotation.ingest import IngestError, ingest_outcome

    said = []
    taken = 0
    for out in data.label_store().pending():
        try:
            batch = read_manifest(out.folder)
        except ValueError as error:
            said.append(f"batch {out.id}: {error}")
            continue
        if not (batch.label_studio or {}).get("project"):
            continue
        try:
            answers, source = _fetch(batch, Path(out.folder), config.label_studio_url, config.label_studio_token)
            outcome = ingest_outcome(batch, answers, source, data.labels, config.agreement, config.annotators)
            _write_disputes(outcome, Path(out.folder))
        except (IngestError, OSError) as error:
            said.append(f"batch {out.id}: not ingested: {str(error).splitlines()[0]}")
            continue
        taken += len(outcome.labeled)
        disputed = f", {len(outcome.disputes)} disputed image(s) in disputes.csv" if outcome.disputes else ""
        said.append(
            f"batch {out.id}: {len(outcome.labeled)} query sets taken in, {len(outcome.removed)} removed, "
            f"{len(outcome.pending)} pending{disputed}"
        )
    if taken and config.train_command:
        finished = subprocess.run(_train_command(config), check=False)
        if finished.returncode != 0:
            said.append(f"train command failed (status {finished.returncode}): the model was not reloaded")
        else:
            said.append(f"trained; {reload()}")
    return said


def serve_main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning serve --config CONFIG --ckpt_path CKPT [--port 9090] [--train_command CMD]``: the ML
    backend for Label Studio (see ``units_lightning.annotation.ml_backend``); runs until interrupted.

    Raises:
        ValueError: as for ``select``; or no checkpoint (an untrained model suggests nothing).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    page = short_help("serve", words)
    if page is not None:
        print(page)
        return
    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
    from units_lightning.annotation.ml_backend import Debouncer, Predictor, make_server

    parser = _serve_parser()
    config = parser.parse_args(full_help_words(words))
    if not config.ckpt_path:
        raise ValueError("serve needs --ckpt_path: an untrained model has no suggestion to make")
    built = parser.instantiate(config)
    data, model = built.data, built.model
    if not isinstance(data, AnnotatedTasksDataModule):
        raise ValueError("serve needs data.class_path units_lightning.annotation.AnnotatedTasksDataModule")
    model.sampler = data.sampler
    step, _ = _restore(model, config.ckpt_path)
    model.to(config.device)
    predictor = Predictor(model, data.project(), data.label_store, data.image_shape, config.hint_vacuity, step)

    def reload() -> str:
        with predictor.lock:
            predictor.step, _ = _restore(model, config.ckpt_path)
        return f"reloaded {_shown(config.ckpt_path)} ({predictor.version})"

    def retrain() -> None:
        for line in retrain_once(data, config, reload):
            print(f"units-lightning serve: {line}", flush=True)

    server = make_server(predictor, Debouncer(retrain, config.debounce), config.host, config.port)
    host, port = server.server_address[:2]
    record = read_project_record(data.root)
    where = f"Label Studio project {record.project} at {record.url}" if record else "Label Studio: the project's"
    print(
        f"units-lightning serve: the ML backend of {_shown(data.root)} at http://{host}:{port} ({predictor.version}); "
        f"in {where}: Settings > Model > Connect Model, this URL",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m units_lightning.annotation.commands {select,ingest,serve} ...``."""
    words = sys.argv[1:] if argv is None else list(argv)
    commands = {"select": select_main, "ingest": ingest_main, "serve": serve_main}
    if not words or words[0] not in commands:
        sys.exit(f"usage: python -m units_lightning.annotation.commands {{{','.join(commands)}}} [options] (--help)")
    try:
        commands[words[0]](words[1:])
    except (ValueError, OSError) as error:  # bad input: the message, not a traceback (as units-lightning does)
        print(f"units-lightning {words[0]}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

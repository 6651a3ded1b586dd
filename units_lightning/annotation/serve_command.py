"""``units-lightning serve``: the model as Label Studio's ML backend, retraining on the answers as they come.

Takes ``select``'s config and checkpoint options (less those of a batch), serves predictions for the tasks
``select`` sent, and after annotations ingests the answers, runs ``--train_command`` and reloads the checkpoint.
Also runnable as ``python -m units_lightning.annotation.commands serve ...``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from units_lightning.annotation.agreement import AGREEMENT_RULES
from units_lightning.annotation.batch import read_manifest
from units_lightning.annotation.command_common import fetch_answers, restore, shown, write_disputes
from units_lightning.annotation.help import full_help_words, short_help
from units_lightning.annotation.label_studio_project import read_project_record
from units_lightning.annotation.select_command import select_parser

# The parser's library, the data and the server (torch, Lightning, jsonargparse) are imported when the command runs:
# `serve --help` imports nothing of them.
if TYPE_CHECKING:
    from jsonargparse import ArgumentParser

    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule

__all__ = ["NEXT_EPOCH", "finished_epochs", "retrain_once", "serve_main", "serve_parser", "train_command"]

NEXT_EPOCH = "{next_epoch}"  # in serve's --train_command: the epochs the served checkpoint finished, plus one


def serve_parser() -> ArgumentParser:
    """serve's parser: select's (``select_parser``) without the options of a batch, with the server's and
    retraining's."""
    parser = select_parser()
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


def train_command(config: Any) -> list[str]:
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
    when something new was taken in, ``config.train_command`` runs (``train_command``) and ``reload()`` loads the
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
            answers, source = fetch_answers(batch, Path(out.folder), config.label_studio_url, config.label_studio_token)
            outcome = ingest_outcome(batch, answers, source, data.labels, config.agreement, config.annotators)
            write_disputes(outcome, Path(out.folder))
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
        finished = subprocess.run(train_command(config), check=False)
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

    parser = serve_parser()
    config = parser.parse_args(full_help_words(words))
    if not config.ckpt_path:
        raise ValueError("serve needs --ckpt_path: an untrained model has no suggestion to make")
    built = parser.instantiate(config)
    data, model = built.data, built.model
    if not isinstance(data, AnnotatedTasksDataModule):
        raise ValueError("serve needs data.class_path units_lightning.annotation.AnnotatedTasksDataModule")
    model.sampler = data.sampler
    step, _ = restore(model, config.ckpt_path)
    model.to(config.device)
    predictor = Predictor(
        model, data.project(), data.label_store, data.image_shape, config.hint_vacuity, step, data.adapt_on_labels
    )

    def reload() -> str:
        with predictor.lock:
            predictor.step, _ = restore(model, config.ckpt_path)
        return f"reloaded {shown(config.ckpt_path)} ({predictor.version})"

    def retrain() -> None:
        for line in retrain_once(data, config, reload):
            print(f"units-lightning serve: {line}", flush=True)

    server = make_server(predictor, Debouncer(retrain, config.debounce), config.host, config.port)
    host, port = server.server_address[:2]
    record = read_project_record(data.root)
    where = f"Label Studio project {record.project} at {record.url}" if record else "Label Studio: the project's"
    print(
        f"units-lightning serve: the ML backend of {shown(data.root)} at http://{host}:{port} ({predictor.version}); "
        f"in {where}: Settings > Model > Connect Model, this URL",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

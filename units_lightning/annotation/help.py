"""What ``select`` and ``serve`` answer to ``--help`` before anything heavy is imported: a short page of the options
people change, written out here, as ``fit --help``'s is (``units_lightning.cli.preflight``).

Their full option list (``--help-full``) is jsonargparse's, from a parser that reads ``UnitsMAML``'s signature and so
imports torch and Lightning (seconds); the short page imports nothing. ``tests/annotation/test_startup.py`` checks
that every option a page names is one the command accepts, and that ``select --help`` loads no Lightning.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FULL_HELP_FLAG", "full_help_words", "short_help"]

FULL_HELP_FLAG = "--help-full"  # the Lightning commands' too (units_lightning.cli.preflight, which this may not import)
HELP_WORDS = ("-h", "--help")

_LABEL_STUDIO = """\
  --label_studio_token T        API token (default $LABEL_STUDIO_API_KEY)
  --hint_vacuity V              pre-select the model's class only for images whose vacuity is below V (default
                                0.5; above: a hint only)"""
_FULL = """\
`units-lightning {command} --help-full` lists every option (each model and data argument)."""

_PAGES = {
    "select": f"""\
usage: units-lightning select --config FILE --budget K [--ckpt_path FILE] [options]

Choose the next annotation batch: adapt to each task's support set, score candidate query sets of its unlabeled
images, and write the most informative as batch.csv and manifest.json (the model's predictions as pre-annotations),
into Label Studio or as its import files. The options people change most:

Choosing
  --config FILE                 the config fit trained with (its data: an AnnotatedTasksDataModule project)
  --ckpt_path FILE              the checkpoint that chooses (fit's last.ckpt); without one (a new project) the
                                batch is random
  --budget K                    query sets to choose for this batch (required)
  --acquisition CLASS           what scores and chooses: MarginSampler by default (the labeling-time winner in
                                docs/RESULTS.md), MultiQuerySampler (the paper's Units score), EntropySampler, ...
                                (units_lightning.samplers) or your own class_path; --acquisition.help CLASS lists
                                one sampler's options
  --label_budget N              the project's budget of labeled query sets
  --device D                    where to score (cpu, cuda, cuda:1, ...)

The batch
  --output FOLDER               the batch's folder (default <root>/batches/<id>)
  --batch_id ID                 the batch's id (default batch-<n>-<hash>)
  --alongside true              select while other batches are pending (their images are left out)
  --cancel ID                   give up a pending batch first, its query sets back to the pool (several:
                                --cancel [a,b])

Label Studio
  --label_studio_url URL        send the batch there (API): into the project's Label Studio project, a tab per
                                batch
{_LABEL_STUDIO}
  --label_studio_files_root D   the folder Label Studio serves local files from (default: its
                                LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT of this shell, else the project folder)
  --image_url_prefix URL        serve images from this URL instead

{_FULL}""",
    "serve": f"""\
usage: units-lightning serve --config FILE --ckpt_path FILE [--port N] [--train_command CMD] [options]

A model server for Label Studio's ML backend API: predictions with score, vacuity and dissonance for the tasks
select sent and, after annotations, the answers ingested, --train_command run and the checkpoint reloaded. The
options people change most:

Model
  --config FILE                 the config fit trained with (its data: an AnnotatedTasksDataModule project)
  --ckpt_path FILE              the checkpoint that predicts (fit's last.ckpt), reloaded after every retraining
  --device D                    where the model runs (cpu, cuda, cuda:1, ...)

Server
  --host ADDRESS                address to listen on (default 127.0.0.1)
  --port N                      port to listen on (default 9090; Label Studio: Settings > Model)
  --debounce S                  seconds of quiet after annotations before retraining (default 30)
  --train_command CMD           the fit to run after new answers are ingested, e.g. "units-lightning fit --config
                                ... --ckpt_path last --trainer.max_epochs {{{{next_epoch}}}}" (the epochs finished,
                                plus one); it must write --ckpt_path (none: ingest only)
  --agreement RULE              how several answers make an image's class: majority or unanimous
  --annotators N                answers wanted per image before it counts (default 1)

Label Studio
  --label_studio_url URL        where the answers are fetched from (default: each batch's)
{_LABEL_STUDIO}

{_FULL}""",
}


def short_help(command: str, arguments: Sequence[str]) -> str | None:
    """The short ``--help`` page of ``select`` or ``serve`` when ``arguments`` ask for help, else None."""
    if command not in _PAGES or not any(word in HELP_WORDS for word in arguments):
        return None
    return _PAGES[command].format(command=command)


def full_help_words(words: Sequence[str]) -> list[str]:
    """``words`` with ``--help-full`` as jsonargparse's ``--help``."""
    return ["--help" if word == FULL_HELP_FLAG else word for word in words]

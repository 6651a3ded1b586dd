"""What the Lightning commands answer before Lightning is imported (which takes seconds): each command's short
``--help`` page, and a ``--config`` file that does not exist.

``units-lightning fit --help`` shows the options people change, one line each; ``--help-full`` is jsonargparse's
list of every option (about 2,300 lines for ``fit``). ``tests/test_cli_help.py`` checks that every option named
on a page is one the command accepts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FULL_HELP_FLAG", "LIGHTNING_COMMANDS", "config_refusal", "config_values", "full_help_words", "short_help"]

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
FULL_HELP_FLAG = "--help-full"
HELP_WORDS = ("-h", "--help")

_USAGE = "usage: units-lightning {command} --config FILE [--config FILE ...] [options]"
_RUN = """\
  -c, --config FILE             a YAML config (configs/quickstart.yaml, configs/omniglot_20w1s.yaml, ...); a later
                                file and every option below override what the files before it set
  --print_config                print the config as the command would run it, and stop"""
_HARDWARE = """\
  --trainer.accelerator NAME    cpu, gpu or auto
  --trainer.devices N           how many GPUs (several: one process each, DDP)
  --trainer.default_root_dir D  where runs live: D/units-lightning/<run id>/ (checkpoints, summary, config)"""
_DATA = """\
  --data CLASS                  the data module: OmniglotDataModule, CIFARFSDataModule, MiniImageNetDataModule,
                                FewShotImageFolderDataModule (units_lightning.data) or your own class_path
  --data.root FOLDER            its dataset's folder (the quick start's SyntheticGlyphs has none)"""
_LOGGER = """\
  --trainer.logger.offline B    the configs' W&B logger: true writes the run locally, false streams it (after
                                `wandb login`)
  --trainer.logger false        no logger at all"""
_FULL = (
    "`units-lightning {command} {flag}` lists every option (each Trainer, model and data argument);\n"
    "`--data.help CLASS`, `--model.loss.help CLASS` or `--data.sampler.help CLASS` list one class's options."
)

_PAGES = {
    "fit": f"""\
{_USAGE.format(command="fit")}

Train a model. A config file sets everything; the options people change most, one line each:

Run
{_RUN}
  --seed_everything N           the seed of the weights, the tasks and the shuffling
  --ckpt_path last|best|FILE    continue this config's newest run (last), start from its best checkpoint by
                                val/acc (best), or from a checkpoint file
  --progress validation|steps   one line per validation (default), or Lightning's progress bar

Length and hardware
  --trainer.max_steps N         stop after N meta-training steps
  --trainer.max_epochs N        stop after N epochs (an epoch: trainer.limit_train_batches steps)
{_HARDWARE}

Data and task selection
{_DATA}
  --data.sampler CLASS          the task sampler: MultiQuerySampler (Units-ML), RandomSampler (Units-NTS),
                                VacuitySampler, ... (units_lightning.samplers) or your own class_path
  --data.sampler.tasks N        tasks per meta-batch
  --data.sampler.query_sets N   candidate query sets scored per task; the most uncertain is labeled
  --data.sampler.warmup_steps N steps of random choice before selection starts

Model and loss (units_lightning.losses.EvidentialLoss)
  --model.lr LR                 the outer loop's Adam learning rate
  --model.inner_steps N         adaptation steps per task
  --model.label_budget N        stop when N query sets have been labeled
  --model.loss.ib_reduction R   sum (the paper's) or mean (the authors' code) over classes
  --model.loss.activation A     evidence from the logits: softplus (the paper's), relu or exp
  --model.loss.vacuity_weight W the vacuity regulariser against the zero-evidence freeze; 0: off

Logging
{_LOGGER}

{_FULL}""",
    "validate": f"""\
{_USAGE.format(command="validate")}

Evaluate a checkpoint on the validation tasks. The options people change most:

{_RUN}
  --ckpt_path last|best|FILE    this config's newest checkpoint (last), its best by val/acc (best), or a file
{_HARDWARE}
{_DATA}
  --data.val_tasks N            how many fixed validation tasks
{_LOGGER}

{_FULL}""",
    "test": f"""\
{_USAGE.format(command="test")}

Evaluate a checkpoint on the test tasks: results.json, plots and the out-of-distribution probes in its run's
folder. The options people change most:

{_RUN}
  --ckpt_path last|best|FILE    this config's newest checkpoint (last), its best by val/acc (best), or a file
{_HARDWARE}
{_DATA}
  --data.test_tasks N           how many fixed test tasks
  --verbose true                also Lightning's table of every metric
{_LOGGER}

{_FULL}""",
    "predict": f"""\
{_USAGE.format(command="predict")}

Classify your own images with a checkpoint: predictions.csv and predictions.json, with vacuity and abstentions.
The options people change most:

{_RUN}
  --ckpt_path last|best|FILE    this config's newest checkpoint (last), its best by val/acc (best), or a file
  --data units_lightning.data.FolderPredictionDataModule
                                your images: --data.support FOLDER (one folder per class) --data.query FOLDER
  --data.support FOLDER         the labeled examples, one folder per class
  --data.query FOLDER           the images to classify
  --prediction.threshold V      abstain where vacuity >= V (default 0.2)
  --prediction.min_probability P
                                abstain too where the largest probability < P: the better filter of likely mistakes
  --prediction.output_dir D     where the predictions go (default: the checkpoint's run folder)
{_HARDWARE}

{_FULL}""",
}


def short_help(command: str, arguments: Sequence[str]) -> str | None:
    """The short ``--help`` page of Lightning command ``command`` when ``arguments`` ask for help, else None."""
    if command not in _PAGES or not any(word in HELP_WORDS for word in arguments):
        return None
    return _PAGES[command].format(command=command, flag=FULL_HELP_FLAG)


def full_help_words(words: Sequence[str]) -> list[str]:
    """``words`` with ``--help-full`` as jsonargparse's ``--help``."""
    return ["--help" if word == FULL_HELP_FLAG else word for word in words]


def config_refusal(command: str, arguments: Sequence[str]) -> str | None:
    """The paragraph that refuses a ``--config`` file that does not exist, or None when every one does (or
    is a YAML string, which jsonargparse reads as a config)."""
    for value in config_values(arguments):
        if os.path.isfile(value) or not _names_a_file(value):
            continue
        path = Path(value)
        near = None if path.is_dir() else _nearby_config(path)
        if path.is_dir():
            what, hint = "is a folder, not a config file", " Name a .yaml file in it."
        else:
            what = "does not exist"
            hint = f" Did you mean --config {near}?" if near else ""
            hint = hint or (" The shipped configs are in configs/." if Path("configs").is_dir() else "")
        return (
            f"units-lightning {command}: error: --config {value}: {what} (looked for {path.resolve()}).{hint}\n"
            f"  (`units-lightning {command} --help` lists the options)"
        )
    return None


def config_values(arguments: Sequence[str]) -> list[str]:
    """The values of ``--config`` / ``-c`` in a command line."""
    values = []
    for index, word in enumerate(arguments):
        if word in ("--config", "-c") and index + 1 < len(arguments):
            values.append(arguments[index + 1])
        elif word.startswith("--config="):
            values.append(word.split("=", 1)[1])
    return values


def _names_a_file(value: str) -> bool:
    """Whether jsonargparse would take ``value`` for a file name (YAML that reads as one string), not for a config
    given inline (``--config '{trainer: {max_steps: 10}}'``)."""
    import yaml

    try:
        return isinstance(yaml.safe_load(value), str)
    except yaml.YAMLError:
        return False


def _nearby_config(path: Path) -> str | None:
    """A config file of the same name in ``configs/`` (or a close name there), the one probably meant."""
    import difflib

    folder = Path("configs")
    if not folder.is_dir():
        return None
    names = sorted(candidate.name for candidate in folder.glob("*.yaml"))
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return str(folder / close[0]) if close else None

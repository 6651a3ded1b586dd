"""``units-lightning``'s entry point: ``--help``, the package's own commands (``report``, ``dashboard``,
``select``, ``ingest``), the Lightning commands through ``cli_main``, and bad input as one paragraph.

Nothing heavy is imported here: a command loads what it needs when it runs (Lightning, torch, matplotlib, W&B,
the annotation stack), so ``--help``, ``fit --help`` and a refused command answer in a fraction of a second."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

from units_lightning import errors
from units_lightning.cli import preflight

__all__ = ["COMMANDS", "cli_main", "main", "overview"]

COMMANDS = {
    "fit": "train a model (--config configs/quickstart.yaml); --ckpt_path last continues a stopped run",
    "validate": "evaluate a checkpoint on the validation tasks",
    "test": "evaluate a checkpoint on the test tasks: results.json, plots, out-of-distribution probes",
    "predict": "classify your own images with a checkpoint: predictions.csv, with vacuity and abstentions",
    "report": "draw a run's dashboard offline (report.html and PNGs); several runs side by side",
    "dashboard": "save the belief dashboard as a W&B workspace (--dry-run prints it, no account needed)",
    "select": "choose the unlabeled images of an annotation project most worth labeling next",
    "ingest": "read finished annotations back into an annotation project's labels",
    "serve": "a model server for Label Studio (ML backend API): predictions with vacuity and dissonance, retraining",
}


def overview() -> str:
    """``units-lightning --help``: every command, one line each."""
    width = max(len(name) for name in COMMANDS)
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items())
    return (
        "usage: units-lightning <command> [options]\n\n"
        "Units-ML (Pandey & Yu, CVPR 2022) on PyTorch Lightning: few-shot classifiers that say how sure they are,\n"
        "trained on the tasks that teach them most.\n\n"
        f"commands:\n{rows}\n\n"
        "`units-lightning <command> --help` shows a command's main options (`--help-full`: all of them). Errors\n"
        "from bad input are one paragraph; "
        f"{errors.DEBUG_FLAG} (or {errors.DEBUG_ENV}=1) shows the traceback."
    )


def _working_folder_importable() -> None:
    """Put the working folder first on the import path, as ``python -m`` does, so that a config's
    ``class_path: my_lab.samplers.MySampler`` finds ``./my_lab`` from the console script too."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def cli_main(args: list[str] | None = None) -> Any:
    """The Lightning commands: ``units_lightning.cli.parser.cli_main``, imported (with Lightning) when called."""
    from units_lightning.cli.parser import cli_main as run

    return run(args)


def _stopped_by_signal(error: BaseException) -> bool:
    """Whether ``error`` is Lightning's stop after SIGTERM (or Ctrl-C) at a step boundary, a ``SystemExit``."""
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")  # loaded by any command that trains
    return exceptions is not None and isinstance(error, exceptions.SIGTERMException)


def _lightning_command(words: list[str], argv_given: bool, debug: bool) -> None:
    from units_lightning.cli.arguments import UnitsArgumentParser

    UnitsArgumentParser.debug = debug
    try:
        if argv_given:
            cli_main(words)
            return
        sys.argv = [sys.argv[0], *words]  # LightningCLI reads sys.argv itself (given args it warns)
        cli_main(None)
    finally:
        UnitsArgumentParser.debug = False


def _dispatch(words: list[str], argv_given: bool, debug: bool) -> None:
    command = words[0]
    if command == "dashboard":
        from units_lightning.dashboard.workspace import main as dashboard_main

        return dashboard_main(words[1:])
    if command == "report":
        from units_lightning.dashboard.report import main as report_main

        return report_main(words[1:])
    if command in ("select", "ingest", "serve"):
        try:
            commands = importlib.import_module("units_lightning.annotation.commands")
        except ModuleNotFoundError as error:
            if error.name not in ("units_lightning.annotation", "units_lightning.annotation.commands"):
                raise
            sys.exit(f"units-lightning {command}: not available in this installation (no units_lightning.annotation)")
        return getattr(commands, f"{command}_main")(words[1:])
    return _lightning_command(words, argv_given, debug)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (returns nothing, so the exit status is 0 on success).

    ``report``, ``dashboard``, ``select`` and ``ingest`` are this package's own commands; ``fit``, ``validate``,
    ``test`` and ``predict`` go to LightningCLI. Bad input ends with one paragraph and status 1 (2 for the command
    line itself) unless ``--debug`` or ``UNITS_LIGHTNING_DEBUG=1`` asks for the traceback.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    debug = errors.debug_requested(words)
    words = [word for word in words if word != errors.DEBUG_FLAG]
    _working_folder_importable()
    if not words or words[0] in ("-h", "--help", "help"):
        print(overview())
        return None
    command = words[0]
    if command not in COMMANDS and not command.startswith("-"):
        near = errors.closest(command, COMMANDS, cutoff=0.5)
        hint = f" Did you mean `units-lightning {near}`?" if near else ""
        print(f"units-lightning: error: unknown command {command!r}.{hint}\n\n{overview()}", file=sys.stderr)
        sys.exit(2)
    if command in preflight.LIGHTNING_COMMANDS:
        page = preflight.short_help(command, words[1:])
        if page is not None:
            print(page)
            return None
        words = preflight.full_help_words(words)
        refusal = None if debug else preflight.config_refusal(command, words[1:])
        if refusal is not None:
            print(refusal, file=sys.stderr)
            sys.exit(2)
    ranks = _data_parallel_ranks(command, words, argv_given=argv is not None)
    finished = False
    try:
        result = _dispatch(words, argv is not None, debug)
        finished = True
        return result
    except SystemExit as error:  # Lightning stops at the next step boundary, then exits with status 0: say 143 / 130
        if not _stopped_by_signal(error):
            raise
        from units_lightning.cli.interrupt import StopOnInterrupt

        stopped = signal.SIGINT if StopOnInterrupt.interrupted else signal.SIGTERM
        name = "Ctrl-C (SIGINT)" if stopped == signal.SIGINT else "SIGTERM"
        print(
            f"units-lightning: stopped by {name}; continue with the same command and --ckpt_path last",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + stopped)
    except Exception as error:
        shown = None if debug else errors.user_error(error)
        if shown is None:
            raise
        print(errors.format_error(f"units-lightning {command}", shown), file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if ranks is not None:
            ranks.end(finished)


def _data_parallel_ranks(command: str, words: list[str], argv_given: bool) -> Any:
    """The other ranks of a one-machine data-parallel ``fit``, started before this process imports Lightning
    (``units_lightning.cli.launch``), or None. Only for a command line (not ``main([...])`` from Python, whose
    ``sys.argv`` is not the command to repeat)."""
    if argv_given or command != "fit":
        return None
    from units_lightning.cli import launch

    processes = launch.data_parallel_processes(command, words[1:], dict(os.environ))
    return None if processes is None else launch.start_ranks(processes)

"""Several checkpoints of one run tested in one process: each exactly as its own ``units-lightning test`` command
tests it, with Python, torch, Lightning and the package imported once instead of once per checkpoint.

    python -m benchmarks.tables.evaluate --into runs/paper/budget_omniglot_5w1s/units-ml/seed0/test \\
        --checkpoint labels-04000=.../milestones/labels-04000.ckpt \\
        --checkpoint labels-08000=.../milestones/labels-08000.ckpt \\
        -- --config configs/budget_omniglot_5w1s.yaml --trainer.logger=false

tests checkpoint ``<name>=<file>`` as ``units-lightning test <options after --> --trainer.default_root_dir=<into>/<name>
--ckpt_path=<file>`` does (``checkpoint_test_arguments``), one after the other, through the same entry point
(``units_lightning.cli.main``): the same command-line parsing, seeding (``seed_everything`` at each command), model
options restored from the checkpoint and data module, so ``<into>/<name>/results.json`` holds the same numbers. The
command line, its model, data module and trainer are built again for each checkpoint, so that nothing of one test
carries into the next; what is saved is the start of a process (the interpreter, the imports and, on a GPU, the
CUDA context), once per checkpoint before.

A checkpoint whose test fails is named (``failed: <name>``, its traceback or error paragraph above it in the
output) and the next is tested all the same. A test stopped by SIGTERM or Ctrl-C stops the process: the
checkpoints already tested have their results, the rest none, so a later call tests only those.

Exit status: 0 when every test succeeded, the stopped test's own (143 for SIGTERM, 130 for Ctrl-C) when one was
stopped, otherwise 1 when any failed.
"""

from __future__ import annotations

import argparse
import gc
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence

COMMAND = "units-lightning"
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)


def checkpoint_test_arguments(options: Sequence[str], into: str, name: str, checkpoint: str) -> list[str]:
    """The ``units-lightning test`` arguments of one checkpoint: the shared ``options``, its results folder
    ``<into>/<name>`` and the checkpoint file (``benchmarks.tables.grid.evaluation_command`` uses this too).

    Example:
        >>> checkpoint_test_arguments(["--config", "c.yaml"], "run/test", "labels-04000", "m/labels-04000.ckpt")[1:]
        ['--config', 'c.yaml', '--trainer.default_root_dir=run/test/labels-04000', '--ckpt_path=m/labels-04000.ckpt']
    """
    return ["test", *options, f"--trainer.default_root_dir={into}/{name}", f"--ckpt_path={checkpoint}"]


def parse_checkpoint(text: str) -> tuple[str, str]:
    """``<name>=<file>`` as ``(name, file)``.

    Raises:
        argparse.ArgumentTypeError: no ``=``, an empty side, or a name that is not one folder name.
    """
    name, separator, path = text.partition("=")
    if not separator or not name or not path or "/" in name or name in (".", ".."):
        raise argparse.ArgumentTypeError(f"expected <name>=<checkpoint file> with a folder name, got {text!r}")
    return name, path


def exit_status(code: object) -> int:
    """The exit status a process ending with ``SystemExit(code)`` has: 0 for None, the number, else 1 (a message)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_command(words: Sequence[str], entry: Callable[[list[str] | None], object] | None = None) -> int:
    """Run ``units-lightning <words>`` in this process, as the console script runs it; its exit status.

    ``sys.argv`` is set to the command's for the duration (LightningCLI reads it) and put back after. An exception
    the command does not turn into an exit status is printed with its traceback and counts as status 1.
    """
    if entry is None:
        from units_lightning.cli import main as entry
    saved = sys.argv
    sys.argv = [COMMAND, *words]
    try:
        entry(None)
        return 0
    except SystemExit as error:
        if error.code is not None and not isinstance(error.code, int):
            print(error.code, file=sys.stderr, flush=True)
        return exit_status(error.code)
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    finally:
        sys.argv = saved
        _release_memory()


def _release_memory() -> None:
    """Drop what the finished command left (its model, trainer, CUDA graphs' pools) before the next is built."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_all(
    options: Sequence[str],
    into: str,
    checkpoints: Sequence[tuple[str, str]],
    run: Callable[[Sequence[str]], int] = run_command,
) -> dict[str, int]:
    """Test every ``(name, file)`` of ``checkpoints`` in turn (``checkpoint_test_arguments``), each announced and
    ended by a line in the output; the exit status of each tested, in order. A stopped test ends the loop: the
    checkpoints after it are not in the result."""
    statuses: dict[str, int] = {}
    for number, (name, checkpoint) in enumerate(checkpoints, 1):
        words = checkpoint_test_arguments(options, into, name, checkpoint)
        print(f"=== test {name} ({number} of {len(checkpoints)}): {shlex.join([COMMAND, *words])}", flush=True)
        started = time.monotonic()
        statuses[name] = run(words)
        outcome = "done" if statuses[name] == 0 else f"failed: {name} (exit status {statuses[name]})"
        print(f"=== test {name}: {outcome} in {time.monotonic() - started:.1f} s", flush=True)
        if statuses[name] in STOPPED:
            break
    return statuses


def overall_status(statuses: dict[str, int]) -> int:
    """The process's exit status: a stopped test's, else 1 when any failed, else 0.

    Example:
        >>> overall_status({"a": 0, "b": 0}), overall_status({"a": 1, "b": 0}), overall_status({"a": 1, "b": 143})
        (0, 1, 143)
    """
    stopped = [status for status in statuses.values() if status in STOPPED]
    if stopped:
        return stopped[-1]
    return 1 if any(statuses.values()) else 0


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tables.evaluate",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is given to every `units-lightning test` command.",
    )
    parser.add_argument("--into", required=True, help="the results go to <into>/<name>/ (the run's test/ folder)")
    parser.add_argument(
        "--checkpoint",
        dest="checkpoints",
        type=parse_checkpoint,
        action="append",
        required=True,
        metavar="NAME=FILE",
        help="a checkpoint to test and its results folder's name; repeat for each, tested in this order",
    )
    words = list(sys.argv[1:] if argv is None else argv)
    split = words.index("--") if "--" in words else len(words)
    args = parser.parse_args(words[:split])
    args.options = words[split + 1 :]
    names = [name for name, _ in args.checkpoints]
    if len(set(names)) != len(names):
        parser.error(f"--checkpoint: each name once (one results folder each), got {names}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Test the checkpoints of the command line; the exit status (see the module docstring)."""
    args = parse_arguments(argv)
    statuses = evaluate_all(args.options, args.into, args.checkpoints)
    failed = [name for name, status in statuses.items() if status not in (0, *STOPPED)]
    stopped = [name for name, status in statuses.items() if status in STOPPED]
    untested = [name for name, _ in args.checkpoints if name not in statuses]
    done = len(statuses) - len(failed) - len(stopped)
    summary = f"{done} of {len(args.checkpoints)} checkpoints tested in one process"
    if failed:
        summary += f"; failed: {', '.join(failed)}"
    if stopped:
        summary += f"; stopped during {', '.join(stopped)}, not tested: {', '.join(untested) or 'none'}"
    print(summary, flush=True)
    return overall_status(statuses)


if __name__ == "__main__":
    sys.exit(main())

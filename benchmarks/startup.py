"""How long ``units-lightning`` takes to start: ``import units_lightning``, ``--help``, ``fit --help``, a refused
``fit`` (a config file that does not exist), ``report --help`` and the annotation commands' ``select``, ``ingest``
and ``serve --help``, each the wall time of a fresh process, median of ``--runs`` runs after one untimed warm-up run
(the operating system's file cache warm), and which packages ``import units_lightning`` loads, from ``python -X
importtime``.

``--tree NAME=FOLDER`` (repeatable) measures several source trees side by side, their runs interleaved so that a
busy machine slows each alike: ``git archive HEAD | tar -x -C /tmp/before`` then

    python benchmarks/startup.py --tree before=/tmp/before --tree after=.

Each tree runs with ``PYTHONPATH=<tree>`` from inside it, through this virtualenv's ``units-lightning`` script
(whose ``from units_lightning.cli import main`` then finds the tree's package).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("units-lightning")
COMMANDS = {
    "`import units_lightning`": [sys.executable, "-c", "import units_lightning"],
    "`units-lightning --help`": [str(SCRIPT), "--help"],
    "`units-lightning fit --help`": [str(SCRIPT), "fit", "--help"],
    "`units-lightning fit --config does-not-exist.yaml`": [str(SCRIPT), "fit", "--config", "does-not-exist.yaml"],
    "`units-lightning report --help`": [str(SCRIPT), "report", "--help"],
    "`units-lightning select --help`": [str(SCRIPT), "select", "--help"],
    "`units-lightning ingest --help`": [str(SCRIPT), "ingest", "--help"],
    "`units-lightning serve --help`": [str(SCRIPT), "serve", "--help"],
}
# Packages a command that does not draw, log to W&B or talk to Label Studio has no use for.
WATCHED = ("torch", "lightning", "jsonargparse", "torchvision", "scipy", "matplotlib", "wandb", "requests", "PIL")


def wall_time(command: list[str], tree: Path) -> float:
    """Seconds a fresh process of ``command`` takes from ``tree``, its output discarded."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run(command, cwd=tree, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def import_times(tree: Path) -> dict[str, float]:
    """Cumulative seconds of each module ``import units_lightning`` loads, by its dotted name (``-X importtime``)."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-X", "importtime", "-c", "import units_lightning"]
    lines = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True).stderr.splitlines()
    found: dict[str, float] = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            found[parts[2].strip()] = int(parts[1]) / 1e6  # a module is loaded once: one line each
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each command (the median is shown)")
    parser.add_argument(
        "--tree", action="append", default=None, metavar="NAME=FOLDER", help="a source tree to measure (repeatable)"
    )
    args = parser.parse_args(argv)
    trees = {}
    for item in args.tree or [f"this tree={REPO}"]:
        name, _, folder = item.rpartition("=")
        trees[name or folder] = Path(folder).resolve()
    times: dict[tuple[str, str], list[float]] = {(c, t): [] for c in COMMANDS for t in trees}
    for run in range(args.runs + 1):  # run 0 warms the file cache and is not counted
        for command_name, command in COMMANDS.items():
            for tree_name, tree in trees.items():
                seconds = wall_time(command, tree)
                if run:
                    times[command_name, tree_name].append(seconds)
    header = " | ".join(f"{name} (s)" for name in trees)
    print(f"| command | {header} |\n|---|{'---|' * len(trees)}")
    for command_name in COMMANDS:
        cells = []
        for tree_name in trees:
            values = times[command_name, tree_name]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {command_name} | {' | '.join(cells)} |")
    print("\n`python -X importtime -c 'import units_lightning'`, cumulative seconds of each package it loads:\n")
    print(f"| package | {' | '.join(trees)} |\n|---|{'---|' * len(trees)}")
    found = {name: import_times(tree) for name, tree in trees.items()}
    for package in ("units_lightning", *WATCHED):
        cells = [f"{found[name][package]:.2f}" if package in found[name] else "not loaded" for name in trees]
        print(f"| {package} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

"""The command line of ``benchmarks/paper_tables.py``: which configs, methods and seeds; run them (or list them with
``--dry-run``), then write the tables."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import benchmarks.tables
from benchmarks.common import REPO
from benchmarks.tables.folders import DONE, finished_elsewhere, read_results, status
from benchmarks.tables.grid import (
    GROUPS,
    METHODS,
    ConfigInfo,
    Options,
    Run,
    build_grid,
    evaluation_command,
    fit_command,
    milestone_tests_command,
    parse_extra,
    read_config,
    shown,
    targets_of,
)
from benchmarks.tables.launcher import MPSUnavailable, run_grid, slots, sweep_rate
from benchmarks.tables.report import write_tables


def default_data_root() -> Path | None:
    """``$UNITS_LIGHTNING_SHARED_DATA``, else ``../shared/data`` or ``shared/data`` beside the repository."""
    candidates = [
        os.environ.get("UNITS_LIGHTNING_SHARED_DATA"),
        REPO.parent / "shared" / "data",
        REPO / "shared" / "data",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def resolve_configs(names: Sequence[str]) -> list[ConfigInfo]:
    """Config names (``configs/<name>.yaml``), files, or the groups of ``GROUPS``.

    Raises:
        ValueError: a name that is neither.
    """
    paths = []
    for name in names:
        for item in GROUPS.get(name, (name,)):
            path = Path(item)
            if not path.is_file():
                path = REPO / "configs" / f"{item.removesuffix('.yaml')}.yaml"
            if not path.is_file():
                known = ", ".join([*GROUPS, *sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))])
                raise ValueError(f"--configs: no config {item!r} (a file, or one of: {known})")
            paths.append(path)
    return [read_config(p) for p in dict.fromkeys(paths)]


def resolve_methods(names: Sequence[str] | None) -> list[str] | None:
    if not names:
        return None
    by_lower = {m.lower(): m for m in METHODS}
    unknown = [n for n in names if n.lower() not in by_lower]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    return [by_lower[n.lower()] for n in names]


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=benchmarks.tables.__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["budget", "standard"],
        help="config names or files, or the groups 'budget' and 'standard' (default: both)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        help=f"of {', '.join(METHODS)} (default: MAML, Units-NTS, Units-ML for budget configs; "
        "Units-NTS, Units-ML otherwise)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--root",
        type=Path,
        nargs="+",
        default=[REPO / "runs" / "paper"],
        help="one folder per run: <root>/<config>/<method>/seed<k>. With --tables-only several roots may be given "
        "(the runs of several calls or hosts): a run not finished under the first is taken from the first other root "
        "that holds it finished",
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        help="holds omniglot/, cifarfs/, miniimagenet/ (folders or zips); default: ../shared/data when present, "
        "else each config's data.root",
    )
    parser.add_argument(
        "--extra",
        nargs="+",
        default=[],
        help='overrides for every fit and test, e.g. "trainer.max_steps=200 data.val_tasks=20"',
    )
    parser.add_argument(
        "--logger",
        choices=("csv", "config"),
        default="csv",
        help="csv: a CSVLogger in each run folder; config: the config's logger, its save_dir moved there",
    )
    parser.add_argument(
        "--parallel", type=int, help="runs at once, at most (default: 1; with --gpus, --per-gpu on each GPU)"
    )
    parser.add_argument(
        "--gpus", help="e.g. 0,1,2,3: the GPUs runs are packed onto (CUDA_VISIBLE_DEVICES), --per-gpu on each"
    )
    parser.add_argument(
        "--per-gpu",
        type=int,
        help="runs on each GPU at once, each GPU kept filled while runs are left (default 1, or as many as --parallel "
        "needs)",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="run the commands under a CUDA MPS daemon started for this call (several runs on one GPU share it "
        "without time slices); needs nvidia-cuda-mps-control",
    )
    parser.add_argument(
        "--time-limit", type=float, help="seconds this call may take; the runs checkpoint and stop in time"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds before --time-limit at which the running commands get SIGTERM (default 60)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list the runs, their commands and what is done; run nothing"
    )
    parser.add_argument(
        "--tables-only", action="store_true", help="build the tables and plots from the finished runs; run nothing"
    )
    parser.add_argument("--tables", type=Path, help="where the tables go (default: <root>/tables)")
    args = parser.parse_args(argv)
    args.gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    try:
        slots(args.gpus, args.per_gpu, args.parallel)
    except ValueError as error:
        parser.error(str(error))
    if len(args.root) > 1 and not args.tables_only:
        parser.error("several --root folders are read only to build tables: add --tables-only, or give one --root")
    if args.time_limit is not None and args.time_limit <= args.grace:
        parser.error(f"--time-limit ({args.time_limit:g} s) must exceed --grace ({args.grace:g} s)")
    return args


def _dry_run(runs: Sequence[Run], options: Options) -> None:
    states = {run: status(run, options) for run in runs}
    kinds = ("done", "partial", "new", "conflict")
    counts = {kind: sum(s.split(":")[0] == kind for s in states.values()) for kind in kinds}
    print(f"{len(runs)} runs under {shown(options.root)}: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
    for run, state in states.items():
        print(f"\n{run.label}: {state}")
        if state == "done":
            continue
        print(f"  fit: {shlex.join(fit_command(run, options))}")
        targets = targets_of(run.config)
        for target in targets:
            mark = "done" if read_results(run, target) is not None else "to do"
            print(f"  test {target.name} ({mark}): {shlex.join(evaluation_command(run, target, options))}")
        pending = [t for t in targets if t.milestone is not None and read_results(run, t) is None]
        if pending:  # what the call runs for them: the test commands above, in one process
            print(f"  tests to do, in one process: {shlex.join(milestone_tests_command(run, pending, options))}")


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """Run the selected grid (or list it, or only table it); the exit status (``benchmarks/paper_tables.py``).

    ``started``: the ``time.monotonic()`` from which ``--time-limit`` counts (default: now).
    """
    started = time.monotonic() if started is None else started
    args = parse_arguments(argv)
    try:
        configs = resolve_configs(args.configs)
        data_root = args.data_root or default_data_root()
        if data_root is not None:
            data_root = data_root.resolve()
            missing = sorted({c.dataset for c in configs if c.dataset and not (data_root / c.dataset).is_dir()})
            if missing:
                raise ValueError(f"no {', '.join(missing)} folder under --data-root {data_root}")
        options = Options(args.root[0].resolve(), data_root, parse_extra(args.extra), args.logger)
        methods = resolve_methods(args.methods)
        runs = build_grid(configs, methods, args.seeds, options.root)
        elsewhere = [build_grid(configs, methods, args.seeds, root.resolve()) for root in args.root[1:]]
        runs, notes = finished_elsewhere(runs, elsewhere)
    except ValueError as error:
        print(f"paper_tables: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            _dry_run(runs, options)
            sys.stdout.flush()
        except BrokenPipeError:  # `--dry-run | head`: the reader left; nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    failed = False
    if not args.tables_only:
        places = slots(args.gpus, args.per_gpu, args.parallel)
        gpus = sorted({gpu for gpu in places if gpu is not None})
        if gpus:
            per_gpu = {gpu: places.count(gpu) for gpu in gpus}
            print(f"packing: {len(places)} runs at once on GPUs {', '.join(f'{g} ({n})' for g, n in per_gpu.items())}")
        done_before = {run for run in runs if (run.folder / DONE).is_file()}
        launched = time.monotonic()
        try:
            outcomes = run_grid(
                runs,
                options,
                args.parallel,
                args.gpus,
                args.time_limit,
                args.grace,
                report=_report,
                started=started,
                per_gpu=args.per_gpu,
                mps=args.mps,
            )
        except MPSUnavailable as error:
            print(f"paper_tables: {error}", file=sys.stderr)
            return 2
        wall = time.monotonic() - launched
        kinds = ("done", "stopped", "failed", "conflict")
        counts = {kind: sum(o.split(":")[0] == kind for o in outcomes.values()) for kind in kinds}
        print(f"{wall:.0f} s: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
        finished = sum(outcome == "done" and run not in done_before for run, outcome in outcomes.items())
        print(sweep_rate(finished, wall, len(gpus)))
        for run, outcome in outcomes.items():
            if outcome.startswith(("failed", "conflict")):
                print(f"  {run.label}: {outcome}")
        if counts["stopped"]:
            print("stopped before the end: run the same command again to continue; --tables-only builds the tables")
            return 3
        failed = bool(counts["failed"] or counts["conflict"])
    for note in notes:
        print(f"paper_tables: {note}")
    written = write_tables(runs, args.tables or options.root / "tables", options.extra)
    print("tables: " + ", ".join(shown(p) for p in written.values()), flush=True)
    return 1 if failed else 0


def _report(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)

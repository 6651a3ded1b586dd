"""Whole runs of one config under several option sets, side by side, round after round: does an option pay?

Each variant (a name, the ``fit`` options and environment variables that make it, and optionally another checkout of
the project, to compare commits) runs ``benchmarks/whole_run.py`` in a process of its own, with a compile cache of its
own (``UNITS_LIGHTNING_COMPILE_CACHE``). Round 1 starts every variant from an empty cache, as on a fresh machine; the
rounds after it reuse each variant's cache, as on a machine that has run it before. On a GPU host the variants of a
round start together, one a GPU (more variants than GPUs: in waves), so that they share the host's state and noise, and
each round moves them one GPU on; without GPUs they run one after another, in the reverse order every other round.
Comparing runs on different machines, or one after another on a shared one, measures the machines.

The table gives each run's steady milliseconds a step before and after selection starts, the one-off costs
(compiling, capture), the run as measured and the config's full run projected, and each variant's speed over the
first variant's in the same round. Options after ``--`` go to every run (``whole_run.py`` passes what it does not
know to ``fit``).

    python benchmarks/side_by_side.py --config configs/omniglot_20w1s.yaml --steps 5000 --rounds 2 --gpus 0 1 \\
        --variant "plain=--model.fold_first_norm false" --variant "folded=--model.fold_first_norm true" \\
        --out /tmp/side_by_side -- --data.root <omniglot>
    python benchmarks/side_by_side.py --config configs/omniglot_20w1s.yaml --steps 3000 --gpus 0 1 --out <new folder> \\
        --variant as-shipped --variant "cudnn-v7=TORCH_CUDNN_V8_API_DISABLED=1" -- --data.root <omniglot>
    git worktree add /tmp/before <commit> && python benchmarks/side_by_side.py --config configs/omniglot_20w1s.yaml \\
        --steps 5000 --gpus 0 1 --out <new folder> --variant "before@/tmp/before" --variant now \\
        -- --data.root <omniglot>
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WHOLE_RUN = Path(__file__).resolve().with_name("whole_run.py")


@dataclass(frozen=True)
class Run:
    variant: str
    round: int
    gpu: str | None  # None: the CPU, or whatever devices this process sees


@dataclass(frozen=True)
class Variant:
    name: str
    options: tuple[str, ...] = ()  # for ``fit`` (through whole_run.py)
    env: tuple[tuple[str, str], ...] = ()  # environment variables of its processes
    tree: Path | None = None  # another checkout of the project: its whole_run.py, configs and package; None: this one


def parse_variant(text: str) -> Variant:
    """``"NAME[@TREE]=[VAR=value ...] [--fit.option value ...]"``: the words before the first option that read
    ``VAR=value`` (capitals, digits and _) are environment variables of the variant's processes
    (``TORCHINDUCTOR_...``, ``CUDNN_...``); the rest go to ``fit``. A name alone is the config as it is. With ``@TREE``
    the variant runs another checkout of the project (an older commit's code: ``git worktree add <folder> <commit>``),
    its own ``benchmarks/whole_run.py``, config and package."""
    head, _, rest = text.partition("=")
    name, at, tree = head.partition("@")
    if not name or not name.replace("-", "").replace("_", "").isalnum() or (at and not tree):
        raise argparse.ArgumentTypeError(
            f"a variant is NAME[@TREE]=OPTIONS, NAME of letters, digits, - and _: {text!r}"
        )
    words, env = shlex.split(rest), []
    while words and not words[0].startswith("-") and "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        if not key or not all(c.isupper() or c.isdigit() or c == "_" for c in key):
            raise argparse.ArgumentTypeError(f"{key}={value} in variant {name!r}: not an environment variable's name")
        env.append((key, value))
    return Variant(name, tuple(words), tuple(env), Path(tree).resolve() if at else None)


def waves(names: list[str], rounds: int, gpus: list[str]) -> list[list[Run]]:
    """The runs in the order they start: all of a wave at once. With GPUs, a round's variants take one GPU each, in
    waves of ``len(gpus)``, the GPUs rotated by one every round (so that a faster GPU favours no variant over the
    rounds); without, one run a wave, the order reversed every other round."""
    planned: list[list[Run]] = []
    for round_ in range(1, rounds + 1):
        if gpus:
            turn = (round_ - 1) % len(gpus)
            rotated = gpus[turn:] + gpus[:turn]  # each round moves the variants one GPU on: no variant keeps a GPU
            for first in range(0, len(names), len(gpus)):
                chunk = names[first : first + len(gpus)]
                planned.append([Run(name, round_, gpu) for name, gpu in zip(chunk, rotated, strict=False)])
        else:
            order = names if round_ % 2 else names[::-1]
            planned.extend([Run(name, round_, None)] for name in order)
    return planned


def run_file(run: Run, out: Path, suffix: str = "") -> Path:
    """Where a run's files go: ``<out>/<variant>/round<k><suffix>`` (its run folder, ``.json`` figures, ``.log``)."""
    return out / run.variant / f"round{run.round}{suffix}"


def command(run: Run, variant: Variant, config: str, steps: int | None, common: list[str], out: Path) -> list[str]:
    """The run's ``whole_run.py`` command: its tree's script and, where the config path is relative, its tree's
    config; every run's options, then the variant's (the later wins), then its run folder."""
    script, steps_args = WHOLE_RUN, [] if steps is None else ["--steps", str(steps)]
    if variant.tree is not None:
        script = variant.tree / "benchmarks" / "whole_run.py"
        config = config if Path(config).is_absolute() else str(variant.tree / config)
    return [
        sys.executable, str(script), "--config", config, *steps_args, "--json", str(run_file(run, out, ".json")),
        *common, *variant.options, "--trainer.default_root_dir", str(run_file(run, out)),
    ]  # fmt: skip


def environment(run: Run, variant: Variant, out: Path) -> dict[str, str]:
    env = {**os.environ, **dict(variant.env), "UNITS_LIGHTNING_COMPILE_CACHE": str(out / run.variant / "cache")}
    if run.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = run.gpu
    if variant.tree is not None:  # its package before any installed one (an editable install points at this tree)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(variant.tree), env.get("PYTHONPATH")]))
    return env


def run_wave(
    wave: list[Run], commands: dict[Run, list[str]], envs: dict[Run, dict[str, str]], out: Path, limit: float
) -> dict[Run, str]:
    """Start a wave's runs together and wait for them (each at most ``limit`` seconds); what went wrong, by run."""
    started = {}
    for run in wave:
        log = run_file(run, out, ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as stream:
            started[run] = subprocess.Popen(commands[run], stdout=stream, stderr=subprocess.STDOUT, env=envs[run])
    deadline, problems = time.monotonic() + limit, {}
    for run, process in started.items():
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            problems[run] = f"stopped after {limit:g} s (--limit)"
            continue
        if code:
            problems[run] = f"exit status {code}: {run_file(run, out, '.log')}"
    return problems


def _describe(run: Run) -> str:
    return f"{run.variant} (round {run.round}{'' if run.gpu is None else f', GPU {run.gpu}'})"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _speed(base: float | None, value: float | None) -> str:
    return "-" if base is None or value is None else f"{base / value:.2f}x"


def table(runs: list[Run], figures: dict[Run, dict], problems: dict[Run, str]) -> str:
    """One row a run; speeds are the round's first variant's step time over this run's (above 1: faster)."""
    first = runs[0].variant
    lines = [
        f"| variant | round | ms a step: warm-up / scoring | speed over {first}: warm-up / scoring | one-off s "
        "| measured s | full run projected |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        if run in problems or run not in figures:
            lines.append(f"| {run.variant} | {run.round} | {problems.get(run, 'no figures')} | | | | |")
            continue
        row = figures[run]
        base = next((figures[other] for other in figures if (other.variant, other.round) == (first, run.round)), {})
        warm, scoring = row.get("warmup_step_ms"), row.get("scoring_step_ms")
        full = row.get("full_total_s")
        lines.append(
            f"| {run.variant} | {run.round} | {_ms(warm)} / {_ms(scoring)} "
            f"| {_speed(base.get('warmup_step_ms'), warm)} / {_speed(base.get('scoring_step_ms'), scoring)} "
            f"| {row['one_off_s']:.1f} | {row['total_s']:.1f} "
            f"| {'-' if full is None else f'{full:.1f} s = {full / 60:.1f} min'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[Run, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the config every variant runs")
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        required=True,
        help='"NAME[@TREE]=[VAR=value ...] [--option ...]" (TREE: another checkout, e.g. an older commit\'s)',
    )
    parser.add_argument("--steps", type=int, help="steps of each run (whole_run.py projects the full run)")
    parser.add_argument("--rounds", type=int, default=2, help="round 1 from empty caches, the rest from each its own")
    parser.add_argument("--gpus", nargs="*", default=[], help="GPU indices, one a variant at a time (none: in turn)")
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds a wave may take before it is stopped")
    parser.add_argument("--out", type=Path, required=True, help="folder for the caches, runs, logs and figures")
    parser.add_argument("common", nargs=argparse.REMAINDER, help="after --: options for every run")
    args = parser.parse_args(argv)
    variants = {variant.name: variant for variant in args.variant}
    if len(variants) != len(args.variant):
        parser.error("each variant needs a name of its own")
    for variant in args.variant:
        if variant.tree is not None and not (variant.tree / "benchmarks" / "whole_run.py").is_file():
            parser.error(f"variant {variant.name}: {variant.tree} holds no benchmarks/whole_run.py: not a checkout")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty: round 1 must start from empty compile caches; give a new folder")
    common = [word for word in args.common if word != "--"]
    names = list(variants)
    plan = waves(names, args.rounds, args.gpus)
    runs = sorted((run for wave in plan for run in wave), key=lambda run: (run.round, names.index(run.variant)))
    figures: dict[Run, dict] = {}
    problems: dict[Run, str] = {}
    for wave in plan:
        commands = {run: command(run, variants[run.variant], args.config, args.steps, common, args.out) for run in wave}
        envs = {run: environment(run, variants[run.variant], args.out) for run in wave}
        print("running " + ", ".join(_describe(run) for run in wave), flush=True)
        problems.update(run_wave(wave, commands, envs, args.out, args.limit))
        for run in wave:
            path = run_file(run, args.out, ".json")
            if run not in problems and path.exists():
                figures[run] = {k: v for k, v in json.loads(path.read_text()).items() if k != "record"}
    device = next((row["device"] for row in figures.values()), "no run finished")
    print(f"\n{args.config} | {device} | {args.steps or 'all'} steps a run\n")
    print(table(runs, figures, problems))
    return figures


if __name__ == "__main__":
    main()

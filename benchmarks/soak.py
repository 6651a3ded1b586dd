"""Soak: the quick start trained for a long time on the CPU, its resident memory sampled as it goes.

Runs the real quick start (``units-lightning fit --config configs/quickstart.yaml``, through the package's own
``cli_main``, W&B offline logger, validation after every 50 steps and the config's checkpointing) with no epoch
limit and a wall-clock limit (``--trainer.max_time``), in this process. A thread samples, every
``--interval`` seconds, the resident set (``VmRSS``) and its high-water mark (``VmHWM``) of this process from
``/proc``, and the RSS of every process below it (data-loader workers, W&B's service), and prints one row per
sample: minutes, steps, validations, checkpoints written, RSS, peak RSS, and the whole tree's RSS. At the end it
prints the start and end rows, the peak RSS at start (after the first validation and checkpoint) and at end,
and the slope of RSS over the run after that warm-up, with a verdict; the sample taken after ``fit`` returned is
shown but not fitted. ``--report run.json`` prints the table and verdict of a run saved with ``--json``.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/soak.py --minutes 30 --root /tmp/soak

Arguments after ``--`` go to ``units-lightning fit`` (e.g. ``-- --data.num_workers 2``). ``--json`` writes the
samples. Memory growth here is independent of speed, so the run can share a busy machine at low priority.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
# A flat run's RSS still moves by allocator noise; growth under both bounds over the run counts as flat.
FLAT_MB = 20.0
FLAT_FRACTION = 0.03


class SoakProgress(Callback):
    """Counts steps, validations and checkpoints into class attributes that the sampling thread reads.

    Class attributes rather than instance ones: LightningCLI instantiates the callback from its class path.
    """

    steps = 0
    validations = 0
    checkpoints = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        SoakProgress.steps = int(trainer.global_step)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            SoakProgress.validations += 1

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        SoakProgress.checkpoints += 1


def _status_kb(pid: int | str, field: str) -> int:
    """One ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``); 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children of all its threads, recursively)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


@dataclass
class Sample:
    minutes: float
    steps: int
    validations: int
    checkpoints: int
    rss_mb: float  # this process (the trainer)
    peak_rss_mb: float  # its VmHWM: the highest RSS so far
    tree_rss_mb: float  # this process and every process below it
    processes: int


def sample(started: float) -> Sample:
    pid = os.getpid()
    others = descendants(pid)
    rss = _status_kb(pid, "VmRSS")
    return Sample(
        minutes=(time.monotonic() - started) / 60,
        steps=SoakProgress.steps,
        validations=SoakProgress.validations,
        checkpoints=SoakProgress.checkpoints,
        rss_mb=rss / 1024,
        peak_rss_mb=_status_kb(pid, "VmHWM") / 1024,
        tree_rss_mb=(rss + sum(_status_kb(p, "VmRSS") for p in others)) / 1024,
        processes=1 + len(others),
    )


HEADER = f"{'min':>6} {'steps':>6} {'val':>4} {'ckpt':>4} {'RSS MB':>8} {'peak MB':>8} {'tree MB':>8} {'procs':>5}"


def row(s: Sample) -> str:
    return (
        f"{s.minutes:6.1f} {s.steps:6d} {s.validations:4d} {s.checkpoints:4d} {s.rss_mb:8.1f} {s.peak_rss_mb:8.1f} "
        f"{s.tree_rss_mb:8.1f} {s.processes:5d}"
    )


def slope_mb_per_hour(samples: list[Sample], field: str) -> float:
    """Least-squares slope of ``field`` against time, in MB per hour."""
    xs = [s.minutes / 60 for s in samples]
    ys = [getattr(s, field) for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


def verdict(samples: list[Sample], after_fit: Sample | None = None) -> list[str]:
    """Start against end, the slopes after the warm-up (first validation and checkpoint), and the verdict.

    ``samples`` are those taken while ``fit`` ran; ``after_fit``, taken once it returned (its summary written, the
    trainer torn down), is reported beside them but left out of the slopes.
    """
    warm = [s for s in samples if s.validations >= 1 and s.checkpoints >= 1] or samples
    first, last = warm[0], samples[-1]
    lines = [
        f"start (after the first validation and checkpoint, {first.minutes:.1f} min, step {first.steps}): "
        f"RSS {first.rss_mb:.1f} MB, peak RSS {first.peak_rss_mb:.1f} MB, tree {first.tree_rss_mb:.1f} MB",
        f"end (last sample in fit, {last.minutes:.1f} min, step {last.steps}, {last.validations} validations, "
        f"{last.checkpoints} checkpoints): RSS {last.rss_mb:.1f} MB, peak RSS {last.peak_rss_mb:.1f} MB, "
        f"tree {last.tree_rss_mb:.1f} MB",
    ]
    if after_fit is not None:
        lines.append(
            f"after fit returned ({after_fit.minutes:.1f} min, step {after_fit.steps}): RSS {after_fit.rss_mb:.1f} MB, "
            f"peak RSS {after_fit.peak_rss_mb:.1f} MB, tree {after_fit.tree_rss_mb:.1f} MB"
        )
    if len(warm) < 3:
        return [*lines, "verdict: too few samples after the warm-up to fit a slope"]
    hours = (warm[-1].minutes - warm[0].minutes) / 60
    lines.append(
        f"RSS over the {60 * hours:.0f} min after warm-up: min {min(s.rss_mb for s in warm):.1f} MB, "
        f"max {max(s.rss_mb for s in warm):.1f} MB"
    )
    growing = []
    for field, name in (("rss_mb", "RSS"), ("peak_rss_mb", "peak RSS"), ("tree_rss_mb", "tree RSS")):
        slope = slope_mb_per_hour(warm, field)
        change = slope * hours
        bound = max(FLAT_MB, FLAT_FRACTION * getattr(first, field))
        lines.append(f"{name}: slope {slope:+.1f} MB/h, {change:+.1f} MB over the {60 * hours:.0f} min after warm-up")
        if change > bound:
            growing.append(name)
    flat = f"under {FLAT_MB:.0f} MB or {100 * FLAT_FRACTION:.0f}% of the start"
    lines.append(f"verdict: {'GROWING: ' + ', '.join(growing) if growing else 'flat'} (flat: growth {flat})")
    return lines


def report(samples: list[Sample], after_fit: Sample | None) -> str:
    """The table of samples and the verdict."""
    rows = [HEADER, *map(row, samples)]
    if after_fit is not None:
        rows.append(row(after_fit) + "  (after fit)")
    return "\n".join([*rows, *verdict(samples, after_fit)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock length of the training run")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--root", default="/tmp/units-lightning-soak", help="run folder (checkpoints, W&B files)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--json", help="write the samples and the verdict to this file")
    parser.add_argument("--report", metavar="JSON", help="print the table and verdict of a run saved by --json")
    parser.add_argument("fit_args", nargs="*", help="after --: more `units-lightning fit` arguments")
    args = parser.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        after_fit = saved.get("after_fit")
        print(report([Sample(**s) for s in saved["samples"]], Sample(**after_fit) if after_fit else None))
        return

    from units_lightning.cli import cli_main

    sys.argv = sys.argv[:1]  # LightningCLI reads its arguments from args=, not from this script's

    seconds = int(round(args.minutes * 60))
    fit_args = [
        "fit",
        "--config",
        args.config,
        "--trainer.max_epochs=-1",
        f"--trainer.max_time=00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}",
        f"--trainer.default_root_dir={args.root}",
        f"--trainer.logger.init_args.save_dir={args.root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=__main__.SoakProgress",
        *args.fit_args,
    ]
    print(f"soak: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"      OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, nice {os.nice(0)}")
    print("      units-lightning " + " ".join(fit_args[1:]), flush=True)

    started = time.monotonic()
    samples: list[Sample] = []
    done = threading.Event()

    def watch() -> None:
        print(HEADER, flush=True)
        while True:
            samples.append(sample(started))
            print(row(samples[-1]), flush=True)
            if done.wait(args.interval):
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        cli_main(fit_args)
    finally:
        done.set()
        watcher.join()
        after_fit = sample(started)
        print(row(after_fit) + "  (after fit)")
        lines = verdict(samples, after_fit)
        print("\n".join(lines), flush=True)
        if args.json:
            saved = {"samples": [asdict(s) for s in samples], "after_fit": asdict(after_fit), "verdict": lines}
            Path(args.json).write_text(json.dumps(saved, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())

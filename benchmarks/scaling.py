"""Data-parallel scaling: tasks/s of a real ``fit`` of a shipped config on 1, 2, 4, ... devices of one machine.

For each config and each device count N it starts a fresh process that builds the run as
``units-lightning fit --config configs/<name>.yaml --trainer.devices N --trainer.strategy ddp`` does (the LightningCLI,
the config's W&B logger offline, checkpointing, the dashboard callbacks; one device keeps the config's own
strategy), with validation off, and trains ``--steps`` steps of the config's meta-batch on every process. The steps
after the first ``--skip`` (graph capture, compilation, the first all-reduces) are timed on every rank with
``benchmarks/fit.py``'s ``StepTimer``; tasks/s counts the tasks of all ranks over the slowest rank's time:
``timed steps x meta-batch per rank x N / seconds``. The speed-up is over the one-device row of the same config in
the same run.

The sampler's warm-up is set to 0 (``--keep-warmup`` keeps the config's), so that the timed steps score and select
as the bulk of a paper run does. Data as ``benchmarks/fit.py``: the shared archives (``--shared``), or random images
in the split layout where they are absent (``--stand-in DIR``; CIFAR-FS and mini-ImageNet). A config of the built-in
synthetic glyphs (``quickstart``) needs no files.

Usage:
    python benchmarks/scaling.py --devices 1 2 4 --steps 300 --skip 50 --stand-in /tmp/stand-in --json scaling.json
    python benchmarks/scaling.py --accelerator cpu --devices 1 2 --configs quickstart --steps 8 --skip 2 \\
        --extra --model.filters=8 --data.image_size=16                       # CPU smoke run (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from lightning.pytorch.callbacks import Callback

if not __package__:  # run as `python benchmarks/scaling.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, cpu_description, versions  # noqa: E402
from benchmarks.fit import StepTimer, add_run_options, data_root  # noqa: E402
from units_lightning.cli import cli_main  # noqa: E402

CONFIGS = ["omniglot_20w1s", "cifarfs_5w5s"]
# Variables of an enclosing launcher (torchrun, SLURM): each measured run starts its own processes on this machine.
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", "SLURM_NTASKS")


class RankTimes(Callback):
    """Every rank's timed seconds and steps, gathered at the end of training (one all-gather, after the timed steps).

    Placed after ``timer`` in the trainer's callbacks, so that it reads the finished timing.
    """

    def __init__(self, timer: StepTimer):
        self.timer = timer
        self.seconds: list[float] = []
        self.steps: list[int] = []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        mine = torch.tensor([self.timer.train_seconds, self.timer.steps], dtype=torch.float64, device=pl_module.device)
        every = pl_module.all_gather(mine).reshape(-1, 2).cpu()
        self.seconds, self.steps = every[:, 0].tolist(), [int(s) for s in every[:, 1]]


def needs_files(config: dict) -> bool:
    """Whether the config's data module reads image files (all but the built-in synthetic glyphs)."""
    return not config["data"]["class_path"].endswith("SyntheticGlyphsDataModule")


def fit_arguments(
    name: str, config: dict, root: Path | None, devices: int, args: argparse.Namespace, out: Path
) -> list[str]:
    """The ``units-lightning fit`` options of one measured run."""
    options = [
        "--config", str(REPO / "configs" / f"{name}.yaml"),
        "--trainer.max_steps", str(args.steps),
        "--trainer.accelerator", args.accelerator,
        "--trainer.devices", str(devices),
        "--trainer.limit_val_batches", "0",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.default_root_dir", str(out),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    if devices > 1:
        options += ["--trainer.strategy", "ddp"]
    if root is not None:
        options += ["--data.init_args.root", str(root)]
    if "save_dir" in (config.get("trainer", {}).get("logger") or {}).get("init_args", {}):
        options += ["--trainer.logger.init_args.save_dir", str(out)]
    if not args.keep_warmup:
        options += ["--data.init_args.sampler.init_args.warmup_steps", "0"]
    return options + args.extra


def measure(name: str, devices: int, args: argparse.Namespace) -> None:
    """One measured run, in this process and (under DDP) the rank processes Lightning starts with the same command.

    Rank 0 writes the row to ``--worker-result``.
    """
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    root = data_root(name, config, args) if needs_files(config) else None
    out = Path(args.out) / f"{name}-{devices}"
    cli = cli_main(fit_arguments(name, config, root, devices, args, out), run=False)
    timer = StepTimer(args.skip)
    times = RankTimes(timer)
    cli.trainer.callbacks.extend([timer, times])
    cli.trainer.fit(cli.model, cli.datamodule)
    if cli.trainer.global_rank != 0:
        return
    tasks = cli.datamodule.sampler.tasks
    world_size = cli.trainer.world_size
    seconds = max(times.seconds)
    row = {
        "config": name,
        "data": str(root) if root is not None else "synthetic",
        "devices": world_size,
        "strategy": type(cli.trainer.strategy).__name__,
        "tasks_per_rank": tasks,
        "tasks_per_step": tasks * world_size,
        "timed_steps": min(times.steps),
        "seconds_per_rank": [round(s, 3) for s in times.seconds],
        "tasks_per_s": round(min(times.steps) * tasks * world_size / seconds, 2),
        "first_steps_s": round(timer.start - timer.fit_start, 2),
        "labeled_query_sets": cli.model.ledger.query_sets,
    }
    Path(args.worker_result).write_text(json.dumps(row) + "\n")


def child_command(name: str, devices: int, args: argparse.Namespace, result: Path) -> list[str]:
    """This script's command line for one measured run (the same options, one config, one device count)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--configs", name, "--devices", str(devices)]
    command += ["--accelerator", args.accelerator, "--steps", str(args.steps), "--skip", str(args.skip)]
    command += ["--shared", args.shared, "--stand-in-images", str(args.stand_in_images), "--out", args.out]
    command += ["--stand-in", args.stand_in] if args.stand_in else []
    command += ["--keep-warmup"] if args.keep_warmup else []
    return command + ["--worker-result", str(result), "--extra", *args.extra]


def run_in_own_process(name: str, devices: int, args: argparse.Namespace) -> dict:
    """Measure one config on ``devices`` devices in a fresh process group (killed whole after ``--timeout``)."""
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    if needs_files(config) and data_root(name, config, args) is None:  # also builds a stand-in once, before the ranks
        return {"config": name, "devices": devices, "skipped": f"no data under {args.shared} (--stand-in DIR)"}
    if args.accelerator in ("gpu", "cuda") and devices > torch.cuda.device_count():
        return {"config": name, "devices": devices, "skipped": f"{torch.cuda.device_count()} GPUs here"}
    result, log = Path(args.out) / f"{name}-{devices}.json", Path(args.out) / f"{name}-{devices}.log"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_SILENT", "true")
    started = time.perf_counter()
    with open(log, "w") as output:
        process = subprocess.Popen(
            child_command(name, devices, args, result),
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return {"config": name, "devices": devices, "error": f"ran past --timeout {args.timeout} s; log: {log}"}
    if process.returncode != 0 or not result.exists():
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        return {"config": name, "devices": devices, "error": f"exit {process.returncode}: {tail[0]}; log: {log}"}
    row = json.loads(result.read_text())
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def add_speedups(rows: list[dict]) -> None:
    """Speed-up of every measured row over the one-device row of its config (None where that is missing)."""
    single = {r["config"]: r["tasks_per_s"] for r in rows if r.get("devices") == 1 and "tasks_per_s" in r}
    for row in rows:
        if "tasks_per_s" in row:
            base = single.get(row["config"])
            row["speedup"] = round(row["tasks_per_s"] / base, 3) if base else None


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table: config, devices, tasks per step (all ranks), tasks/s, speed-up over 1."""
    lines = [
        "| config | devices | tasks/step (per rank x devices) | tasks/s | speed-up vs 1 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "tasks_per_s" in r:
            speedup = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
            per_step = f"{r['tasks_per_step']} ({r['tasks_per_rank']} x {r['devices']})"
            lines.append(f"| {r['config']} | {r['devices']} | {per_step} | {r['tasks_per_s']} | {speedup} |")
        else:
            lines.append(f"| {r['config']} | {r['devices']} | {r.get('skipped') or r.get('error')} | | |")
    return "\n".join(lines)


def device_name(accelerator: str) -> str:
    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    return cpu_description()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="*", default=CONFIGS, help="names of configs/*.yaml")
    parser.add_argument("--devices", nargs="*", type=int, default=[1, 2, 4], help="device counts to measure")
    parser.add_argument("--accelerator", default="gpu", help="gpu, or cpu for a smoke run (gloo)")
    add_run_options(parser)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one measured run may take")
    parser.add_argument("--worker-result", help=argparse.SUPPRESS)  # set by this script for one measured run
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for every fit")
    args = parser.parse_args(argv)
    if not 0 <= args.skip < args.steps:
        parser.error(f"--skip ({args.skip}) must be smaller than --steps ({args.steps}): no step would be timed")
    if any(n < 1 for n in args.devices):
        parser.error(f"--devices must be positive, got {args.devices}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker_result:
        (name,), (devices,) = args.configs, args.devices
        measure(name, devices, args)
        return
    args.out = str(Path(args.out).resolve()) if args.out else tempfile.mkdtemp(prefix="scaling-bench-")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    device = device_name(args.accelerator)
    command = " ".join(["python", "benchmarks/scaling.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"# {device} | {versions()} | steps {args.steps}, timed after {args.skip}", flush=True)
    print(f"# {command}", flush=True)
    rows = []
    for name in args.configs:
        for devices in args.devices:
            rows.append(run_in_own_process(name, devices, args))
            print(json.dumps(rows[-1]), flush=True)
    add_speedups(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "command": command, "rows": rows}, indent=2) + "\n")
    print()
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())

"""Whole-run speed: a real ``fit`` of a shipped config against the bare training step at the same shape.

For each config it builds the run exactly as ``units-lightning fit --config configs/<name>.yaml`` does (the
LightningCLI, the config's logger, checkpointing and the dashboard callbacks), trains ``--steps`` steps, and
times the steps after the first ``--skip`` (graph capture and compilation happen there) with validation taken
out and reported beside it. In the same process it then times the bare step of a copy of the same model on a
batch from the same data module: ``training_step``, backward and Adam, no Lightning, no logging, no data loading.
The ratio fit / bare is what the run's overhead costs.

The sampler's warm-up is set to 0 (``--keep-warmup`` keeps the config's), so that the timed steps score and
select as the bulk of a paper run does; W&B runs offline. On CUDA the steps run as the config's full-length run
would run them: ``capture: auto`` compiles a run of 20,000 steps or more (``units_lightning.module.auto_capture``),
and ``--trainer.max_steps`` would otherwise shorten the run below that, so the benchmark passes the capture the
full run uses (the ``capture`` column; ``--extra --model.capture ...`` overrides it).

Usage:
    python benchmarks/fit.py --device cuda --steps 300 --skip 50           # the five shapes of issue 13
    python benchmarks/fit.py --steps 12 --skip 2 --configs omniglot_5w1s   # CPU
    python benchmarks/fit.py --device cuda --stand-in /tmp/stand-in        # CIFAR-FS / mini-ImageNet absent:
                                                                           # random images in their layout
    python benchmarks/fit.py --device cuda --steps 120 --sync-check 60 80 --configs budget_omniglot_5w1s
        # lists the host synchronisations of steps 60-79 with a stack each, split by logging and quiet steps
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import json
import math
import os
import pstats
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import yaml
from lightning.pytorch.callbacks import Callback

if not __package__:  # run as `python benchmarks/fit.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, device_name, versions  # noqa: E402
from benchmarks.engines import sync, time_steps  # noqa: E402
from units_lightning.cli import cli_main  # noqa: E402
from units_lightning.module import auto_capture  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
CONFIGS = ["omniglot_20w1s", "omniglot_5w1s", "budget_omniglot_5w1s", "cifarfs_5w5s", "miniimagenet_5w1s"]


class StepTimer(Callback):
    """Wall time of the training steps from global step ``skip`` to the end, and of each validation in between."""

    def __init__(self, skip: int):
        self.skip = skip
        self.fit_start = self.start = self.end = None
        self.validation: list[float] = []
        self._validation_start = 0.0
        self.steps = 0

    def _now(self, pl_module: pl.LightningModule) -> float:
        sync(pl_module.device)
        return time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self.fit_start = self._now(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None and trainer.global_step >= self.skip:
            self.start, self.first_step = self._now(pl_module), trainer.global_step

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_start = self._now(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self.start is not None:
            self.validation.append(self._now(pl_module) - self._validation_start)

    def on_train_end(self, trainer, pl_module) -> None:
        self.end = self._now(pl_module)
        self.steps = trainer.global_step - self.first_step

    @property
    def train_seconds(self) -> float:
        return self.end - self.start - sum(self.validation)


class SyncWatch(Callback):
    """The host synchronisations that CUDA's sync debug mode reports from global step ``first`` to ``last``.

    Each is counted with its Python stack, as a logging step's (Lightning reads the logged values there, which
    synchronises by design) or a quiet step's, where there should be none: one synchronisation makes the host wait
    for the GPU to drain its queue, so Lightning's own work no longer overlaps the GPU's. The debug mode is a
    prototype and does not see every synchronisation (PyTorch's caveat).
    """

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self.found: collections.Counter = collections.Counter()
        self._trainer = None
        self._previous = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.first and self._previous is None and self.can_watch(pl_module):
            self._trainer = trainer
            self._previous = warnings.showwarning, warnings.filters[:]
            warnings.simplefilter("always")
            warnings.showwarning = self._record
            torch.cuda.set_sync_debug_mode("warn")
        elif trainer.global_step >= self.last:
            self.stop()

    @staticmethod
    def can_watch(pl_module: pl.LightningModule) -> bool:
        return pl_module.device.type == "cuda"

    def on_train_end(self, trainer, pl_module) -> None:
        self.stop()

    def stop(self) -> None:
        if self._previous is not None:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning, warnings.filters[:] = self._previous
            self._previous = None

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        stack = "".join(traceback.format_stack(limit=16)[:-2])
        kind = "logging" if self._trainer._logger_connector.should_update_logs else "quiet"
        self.found[(kind, stack)] += 1

    def count(self, kind: str) -> int:
        return sum(n for (k, _), n in self.found.items() if k == kind)

    def report(self) -> None:
        for (kind, stack), n in self.found.most_common():
            print(f"--- {n} x in {kind} steps:\n{stack}")
        steps = self.last - self.first
        print(f"synchronisations in steps {self.first}-{self.last - 1}: {self.count('quiet')} in quiet steps, "
              f"{self.count('logging')} in logging steps ({steps} steps)", flush=True)  # fmt: skip


def stand_in(config: dict, folder: Path, images_per_class: int) -> Path:
    """Random images in the split layout the config's data module reads (CIFAR-FS's own class names)."""
    from PIL import Image

    from units_lightning.data.datasets.cifarfs import CIFARFS_CLASSES

    data = config["data"]
    kind = data["class_path"].rsplit(".", 1)[-1]
    size = 32 if kind == "CIFARFSDataModule" else 84
    classes = (
        CIFARFS_CLASSES
        if kind == "CIFARFSDataModule"
        else {s: [f"n{s}{i:04d}" for i in range(n)] for s, n in (("train", 64), ("val", 16), ("test", 20))}
    )
    root = folder / kind
    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    for split, names in classes.items():
        for name in names:
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(images_per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")
    (root / "done").touch()
    return root


def data_root(name: str, config: dict, args: argparse.Namespace) -> Path | None:
    kind = config["data"]["class_path"].rsplit(".", 1)[-1]
    folders = {
        "OmniglotDataModule": "omniglot",
        "CIFARFSDataModule": "cifarfs",
        "MiniImageNetDataModule": "miniimagenet",
    }
    root = Path(args.shared) / folders[kind]
    if root.exists():
        return root
    if args.stand_in:
        return stand_in(config, Path(args.stand_in), args.stand_in_images)
    return None


def planned_steps(config: dict) -> float:
    """Training steps of the config's full run, as Lightning counts them: ``max_steps`` where set, at most
    ``max_epochs`` x ``limit_train_batches`` (an int); infinite when neither bounds the run."""
    trainer = config.get("trainer") or {}
    epochs, batches = trainer.get("max_epochs"), trainer.get("limit_train_batches")
    by_epochs = epochs * batches if isinstance(epochs, int) and isinstance(batches, int) and epochs > 0 else math.inf
    max_steps = trainer.get("max_steps") or -1
    return min(max_steps, by_epochs) if max_steps > 0 else by_epochs


def full_run_capture(config: dict, device: str, extra: list[str]) -> str | None:
    """The ``model.capture`` that the config's full run resolves ``auto`` to on one GPU of a machine where it has not
    compiled before (the compile cache's records can make a shorter run compile), or None where the benchmark leaves
    it alone (on CPU, a config or ``--extra`` that names one)."""
    given = (config.get("model") or {}).get("capture", "auto")
    if device != "cuda" or given != "auto" or any(a.startswith("--model.capture") for a in extra):
        return None
    return auto_capture(planned_steps(config), world_size=1)


def run_one(name: str, args: argparse.Namespace, out: Path) -> dict:
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    root = data_root(name, config, args)
    if root is None:
        return {"config": name, "skipped": f"no data under {args.shared} (give --stand-in DIR for random stand-ins)"}
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    cli_args = [
        "--config", str(REPO / "configs" / f"{name}.yaml"),
        "--data.init_args.root", str(root),
        "--trainer.max_steps", str(args.steps),
        "--trainer.accelerator", accelerator,
        "--trainer.devices", "1",
        "--trainer.default_root_dir", str(out / name),
        "--trainer.logger.init_args.save_dir", str(out / name),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    if not args.keep_warmup:
        cli_args += ["--data.init_args.sampler.init_args.warmup_steps", "0"]
    capture = full_run_capture(config, args.device, args.extra)
    if capture is not None:
        cli_args += ["--model.capture", capture]
    cli_args += args.extra
    cli = cli_main(cli_args, run=False)
    model, data = cli.model, cli.datamodule
    bare_model = copy.deepcopy(model)
    timer = StepTimer(args.skip)
    cli.trainer.callbacks.append(timer)
    watch = SyncWatch(*args.sync_check) if args.sync_check else None
    if watch is not None:
        cli.trainer.callbacks.append(watch)
    wall = time.perf_counter()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(cli.trainer.fit, model, data)
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    else:
        cli.trainer.fit(model, data)
    wall = time.perf_counter() - wall
    tasks = data.sampler.tasks
    fit_rate = timer.steps * tasks / timer.train_seconds

    # The bare step: the same model and sampler, a batch of the same data module, on the device.
    device = torch.device(args.device)
    bare_model.sampler = data.sampler
    bare_model.to(device)
    batch = next(iter(data.train_dataloader()))
    batch = data.transfer_batch_to_device(batch, device, 0)
    step_seconds = time_steps({"bare": bare_model}, batch, device, args.bare_warmup, args.bare_repeats)["bare"]
    bare_rate = tasks / step_seconds
    row = {
        "config": name,
        "data": str(root),
        "tasks_per_step": tasks,
        "capture": getattr(model.engine, "capture", None),
        "timed_steps": timer.steps,
        "fit_tasks_per_s": round(fit_rate, 2),
        "bare_tasks_per_s": round(bare_rate, 2),
        "fit_over_bare": round(fit_rate / bare_rate, 3),
        "first_steps_s": round(timer.start - timer.fit_start, 2),
        "validations": len(timer.validation),
        "validation_s_each": round(sum(timer.validation) / max(len(timer.validation), 1), 2),
        "wall_s": round(wall, 1),
    }
    if watch is not None:
        watch.report()
        row["syncs_in_quiet_steps"] = watch.count("quiet")
        row["syncs_in_logging_steps"] = watch.count("logging")
    print(json.dumps(row), flush=True)
    return row


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a timed fit that ``fit.py`` and ``scaling.py`` share: its length, its data, where it goes."""
    parser.add_argument("--steps", type=int, default=300, help="training steps of each fit")
    parser.add_argument("--skip", type=int, default=50, help="first steps left out of the timing")
    parser.add_argument("--keep-warmup", action="store_true", help="keep the sampler's warm-up (no scoring)")
    parser.add_argument("--shared", default=str(SHARED), help="the shared data folder")
    parser.add_argument("--stand-in", help="folder for random stand-in images where the shared data is absent")
    parser.add_argument("--stand-in-images", type=int, default=140, help="images per class of a stand-in")
    parser.add_argument("--out", help="folder for the runs and their logs (default: a temporary folder)")
    parser.add_argument("--json", help="also write the rows to this file")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="*", default=CONFIGS)
    parser.add_argument("--device", default="cpu")
    add_run_options(parser)
    parser.add_argument("--bare-warmup", type=int, default=5)
    parser.add_argument("--bare-repeats", type=int, default=30)
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions of each fit")
    parser.add_argument(
        "--sync-check",
        nargs=2,
        type=int,
        metavar=("FIRST", "LAST"),
        help="on CUDA: list the host synchronisations of global steps FIRST to LAST - 1, each with its stack",
    )
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for every fit")
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    device = device_name(args.device)
    print(f"# {device} | {versions()} | steps {args.steps}, timed after {args.skip}", flush=True)
    out = Path(args.out or tempfile.mkdtemp(prefix="fit-bench-"))
    rows = []
    for name in args.configs:
        try:
            rows.append(run_one(name, args, out))
        except Exception as error:  # one broken shape must not lose the others' numbers
            rows.append({"config": name, "error": f"{type(error).__name__}: {error}"})
            print(json.dumps(rows[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=2) + "\n")
    print()
    columns = ["config", "tasks/step", "capture", "fit tasks/s", "bare tasks/s", "fit / bare", "first steps (s)"]
    columns.append("validation (s each)")
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for r in rows:
        if "fit_tasks_per_s" in r:
            print(
                f"| {r['config']} | {r['tasks_per_step']} | {r['capture']} | {r['fit_tasks_per_s']} | "
                f"{r['bare_tasks_per_s']} | {r['fit_over_bare']:.2f} | {r['first_steps_s']} | "
                f"{r['validation_s_each']} x {r['validations']} |"
            )
        else:
            print(f"| {r['config']} | {r.get('skipped') or r.get('error')} |")


if __name__ == "__main__":
    sys.exit(main())

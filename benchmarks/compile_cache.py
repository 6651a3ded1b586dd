"""Compiling paid once per machine (issue 35): the same ``units-lightning fit`` twice, each in a fresh process, with
one compile cache folder (``UNITS_LIGHTNING_COMPILE_CACHE``, empty before the first); how long each took from its
launch to the end of its first training step, and what the compiler found in the cache.

Options it does not know go to ``units-lightning fit``; each fit gets its own run folder under a temporary one and a
``StepClock`` callback (``--trainer.callbacks+=``) that writes when the first steps ended and the compiler's cache
counters. ``--model.capture compile`` makes a short run compile (``capture: auto`` compiles runs of 20,000 steps or
more, single GPU):

    python benchmarks/compile_cache.py --config configs/omniglot_20w1s.yaml --data.root <omniglot> \\
        --model.capture compile --trainer.max_steps 5 --trainer.limit_val_batches 0
    python benchmarks/compile_cache.py --config configs/quickstart.yaml --model.capture compile \\
        --trainer.max_steps 3 --trainer.limit_val_batches 0 --model.filters 4 --data.image_size 16   # on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

if not __package__:  # run as `python benchmarks/compile_cache.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO  # noqa: E402

COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"))
COUNTERS += (("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"))


class StepClock(Callback):
    """Write, when training ends, the wall-clock time (``time.time()``) at which each of the first ``steps``
    training steps ended, and the compiler's cache counters (``torch._dynamo.utils.counters``), as JSON to ``path``.

    Args:
        path: the JSON file.
        steps: how many first steps to time.
    """

    def __init__(self, path: str, steps: int = 3):
        self.path, self.steps, self.ends = Path(path), steps, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if len(self.ends) < self.steps:
            if pl_module.device.type == "cuda":
                import torch

                torch.cuda.synchronize(pl_module.device)  # the step is done, not only queued
            self.ends.append(time.time())

    def on_train_end(self, trainer, pl_module) -> None:
        from torch._dynamo.utils import counters

        found = {name: counters[group][name] for group, name in COUNTERS}
        self.path.write_text(json.dumps({"step_ends": self.ends, "counters": found, "device": str(pl_module.device)}))


def folder_megabytes(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def timed_fit(fit_arguments: list[str], cache: Path, work: Path, name: str) -> dict:
    """One ``fit`` in a fresh process: seconds from launch to the end of each first step, and the cache counters."""
    record = work / f"{name}.json"
    command = [sys.executable, "-m", "units_lightning", "fit", *fit_arguments]
    command += [f"--trainer.default_root_dir={work / name}", "--trainer.callbacks+=benchmarks.compile_cache.StepClock"]
    command += [f"--trainer.callbacks.path={record}"]
    environment = {**os.environ, "UNITS_LIGHTNING_COMPILE_CACHE": str(cache), "WANDB_MODE": "offline"}
    launched = time.time()
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
    if done.returncode != 0 or not record.is_file():
        raise SystemExit(f"compile_cache: the {name} fit exited with {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(record.read_text())
    result["to_steps"] = [round(end - launched, 2) for end in result.pop("step_ends")]
    result["cache_mb"] = round(folder_megabytes(cache), 1)
    return result


def table(results: dict[str, dict]) -> str:
    """The two fits side by side, as Markdown."""
    lines = [
        "| fit | launch to step 1 (s) | to step 2 (s) | to step 3 (s) | FX graphs hit / missed | AOTAutograd hit / "
        "missed | cache (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        steps = [f"{s:.1f}" for s in result["to_steps"]] + ["-"] * (3 - len(result["to_steps"]))
        c = result["counters"]
        lines.append(
            f"| {name} | {' | '.join(steps[:3])} | {c['fxgraph_cache_hit']} / {c['fxgraph_cache_miss']} | "
            f"{c['autograd_cache_hit']} / {c['autograd_cache_miss']} | {result['cache_mb']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="the compile cache folder (default: a new temporary one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args, fit_arguments = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as temporary:
        work = Path(temporary)
        cache = args.cache or work / "cache"
        if cache.exists() and any(cache.iterdir()):
            raise SystemExit(f"compile_cache: {cache} is not empty; the first fit must compile from scratch")
        results = {name: timed_fit(fit_arguments, cache, work, name) for name in ("cold", "warm")}
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

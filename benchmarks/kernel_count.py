"""How many kernels ``torch.compile`` generates for one training step of a config, under Inductor's options.

On an H200 the compiled ``omniglot_20w1s`` step is bound by its count of kernels: 1,645 of its 2,367 kernels average
3.3 µs (docs/PERFORMANCE.md). An option meant to fuse more should first show here, on any machine, as fewer kernels,
before it is worth a whole run on a GPU. For each option set, a fresh process compiles one training step of the config
(``--model.capture compile``; the sampler's warm-up set to 0, so that the step scores and selects as a paper step does)
with the compiler's caches off, since a cached graph generates nothing, and reports Inductor's own counters:

- the kernels it generated (Triton on a GPU, C++ on a CPU; the two fuse alike but not identically);
- the IR nodes it had before fusing them;
- the bytes its kernels read and write, by its own estimate (``graph.count_bytes``: each kernel's inputs and outputs,
  once): how many passes over the activations the step makes, which a kernel count alone does not say;
- the seconds of that first step (compiling, mostly) and the milliseconds of a step after it (the mean of 20, after
  3 more that capture the step as a CUDA graph on a GPU).

    python benchmarks/kernel_count.py --config configs/omniglot_20w1s.yaml \\
        --options "" aggressive_fusion=True "max_fusion_size=512,score_fusion_memory_threshold=1" \\
        -- --data.init_args.root <omniglot> --model.inner_steps 1

An option set is ``name=value`` pairs of ``torch._inductor.config`` joined by commas (``""``: the defaults). Options
after ``--`` go to ``units-lightning fit``.
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

if not __package__:  # run as `python benchmarks/kernel_count.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
RESULT = "kernel_count: "  # the child's line of results on its standard output
WARM_STEPS, TIMED_STEPS = 3, 20  # after the first (compiling) step


def parse_options(text: str) -> dict[str, bool | int | float | str]:
    """``"a=True,b=512"`` as Inductor options, each value of its option's type; an unknown name or a value of the
    wrong type is refused with the reason."""
    import torch
    import torch._inductor.config as inductor_config

    options: dict[str, bool | int | float | str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"option {item!r} has no value: write name=value, e.g. aggressive_fusion=True")
        if not hasattr(inductor_config, name):
            raise SystemExit(f"torch._inductor.config has no option {name!r} (torch {torch.__version__})")
        current = getattr(inductor_config, name)
        if isinstance(current, bool):
            if value not in ("True", "False"):
                raise SystemExit(f"option {name} takes True or False, not {value!r}")
            options[name] = value == "True"
        elif isinstance(current, int | float) or current is None:
            kind = float if isinstance(current, float) else int
            try:
                options[name] = kind(value)
            except ValueError:
                raise SystemExit(f"option {name} takes a number, not {value!r}") from None
        else:
            options[name] = value
    return options


def count(config: str, options: dict[str, bool | int | float | str], overrides: list[str]) -> dict[str, float]:
    """In this process: one compiled training step of ``config`` under ``options``, and Inductor's counters."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    from benchmarks.engines import step, sync
    from benchmarks.step_profile import bare_step

    for name, value in options.items():
        setattr(inductor_config, name, value)
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts its graphs' bytes only with this log on
    with tempfile.TemporaryDirectory() as folder:
        model, _, batch, optimizer = bare_step(config, ["--model.capture", "compile", *overrides], folder)
        device = model.device
        metrics.reset()
        start = time.perf_counter()
        step(model, batch, optimizer)
        sync(device)
        first = time.perf_counter() - start
        kernels, nodes, traffic = (
            metrics.generated_kernel_count,
            metrics.ir_nodes_pre_fusion,
            metrics.num_bytes_accessed,
        )
        for _ in range(WARM_STEPS):  # on CUDA the next steps capture the whole step as a graph: not timed
            step(model, batch, optimizer)
        sync(device)
        start = time.perf_counter()
        for _ in range(TIMED_STEPS):
            step(model, batch, optimizer)
        sync(device)
        later = 1000 * (time.perf_counter() - start) / TIMED_STEPS
    return {
        "kernels": kernels,
        "nodes_before_fusion": nodes,
        "megabytes": traffic / 1e6,
        "first_step_s": first,
        "step_ms": later,
        "device": device.type,
    }


def run_child(config: str, options: str, overrides: list[str]) -> dict[str, float]:
    """``count`` in a fresh process with the compiler's caches off; its result line, or the reason it failed."""
    command = [sys.executable, str(Path(__file__).resolve()), "--config", config, "--child", options, "--", *overrides]
    environment = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    raise SystemExit(f"the step under options {options!r} failed (exit {done.returncode}):\n{tail}")


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "| Inductor options | kernels generated | IR nodes before fusion | their memory traffic, MB | "
        "first step (compiling), s | a step, ms |",
        "|---|---|---|---|---|---|",
    ]
    for options, r in results.items():
        lines.append(
            f"| {options or 'defaults'} | {r['kernels']:.0f} | {r['nodes_before_fusion']:.0f} | {r['megabytes']:.0f} | "
            f"{r['first_step_s']:.1f} | {r['step_ms']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="e.g. configs/omniglot_20w1s.yaml")
    parser.add_argument("--options", nargs="+", default=[""], help='option sets, e.g. "" aggressive_fusion=True')
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one option set, counted in this process
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="after --: more fit options")
    args = parser.parse_args(argv)
    overrides = [a for a in args.overrides if a != "--"]
    if args.child is not None:
        print(RESULT + json.dumps(count(args.config, parse_options(args.child), overrides)), flush=True)
        return
    for options in args.options:
        parse_options(options)  # refuse a misspelt option before the first compile, not minutes later
    results = {}
    for options in args.options:
        results[options] = run_child(args.config, options, overrides)
        print(f"{options or 'defaults'}: {results[options]}", flush=True)
    devices = {r["device"] for r in results.values()}
    print(f"\n{args.config}, one training step compiled from scratch on {', '.join(sorted(devices))}:\n")
    print(table(results))


if __name__ == "__main__":
    main()

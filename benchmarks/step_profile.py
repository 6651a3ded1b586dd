"""Where a bare training step and an evaluation batch of a shipped config spend their time on a GPU.

For each config: wall milliseconds per bare step (``training_step``, backward, the model's optimizer: no Lightning,
no logging, no data loading; the sampler's warm-up set to 0, so that every step scores and selects), against the
kernels it launches and their GPU time (``torch.profiler``); the same for one evaluation batch (adapt and predict
its query sets); and the kernels that take the most GPU time. A step whose wall time is far above its GPU time is
bound by the host; one whose wall time is its GPU time, by the kernels.

    python benchmarks/step_profile.py --root <omniglot folder or zips> --configs budget_omniglot_5w1s omniglot_20w1s
    python benchmarks/step_profile.py --root <omniglot> --configs omniglot_20w1s -- --model.capture compile

Options after ``--`` go to each config's ``fit`` (the second line profiles the compiled step). The GPU time is also
split by kernel family (``kernel_family``): convolutions and matrix products, cuDNN's layout conversions, Triton
(compiled) reductions and pointwise kernels, PyTorch's reductions, the rest. ``--launches N`` lists a training step's
N costliest kernels with their launch grids and occupancy (``launches``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

if not __package__:  # run as `python benchmarks/step_profile.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engines import step, sync  # noqa: E402
from units_lightning.cli import cli_main  # noqa: E402

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule

    from units_lightning.episode import TaskBatch
    from units_lightning.module import UnitsMAML


def wall_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / repeats


def kernels(fn: Callable[[], object], repeats: int, rows: int, launch_rows: int = 0) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    by_launch = ""
    if launch_rows:
        with tempfile.TemporaryDirectory() as folder:
            prof.export_chrome_trace(f"{folder}/trace.json")
            by_launch = "\n" + launches(json.loads(Path(folder, "trace.json").read_text()), repeats, launch_rows)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in events) / 1000 / repeats
    shares: dict[str, float] = {}
    for event in events:
        family = kernel_family(event.name)
        shares[family] = shares.get(family, 0.0) + event.device_time / 1000 / repeats
    split = ", ".join(f"{family} {ms:.2f} ms ({ms / busy:.0%})" for family, ms in sorted(shares.items()) if busy)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)
    return f"{len(events) / repeats:.0f} kernels, GPU busy {busy:.2f} ms: {split}\n{table if rows else ''}{by_launch}"


def launches(trace: dict, steps: int, rows: int) -> str:
    """The ``rows`` costliest kernels of a ``torch.profiler`` chrome trace of ``steps`` steps, each with its calls and
    µs a step, µs a call, launch grid and block, and the profiler's estimate of its occupancy: a kernel on a few
    thread blocks, or at a low occupancy, leaves most of the GPU idle, whatever the count of kernels."""
    calls: dict[str, list[dict]] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") == "kernel":
            calls.setdefault(event["name"], []).append(event)
    costliest = sorted(calls.items(), key=lambda item: -sum(e.get("dur", 0.0) for e in item[1]))[:rows]
    lines = [
        "| kernel | calls a step | µs a step | µs a call | grid | block | occupancy % |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, events in costliest:
        total, args = sum(e.get("dur", 0.0) for e in events), events[0].get("args", {})
        grid, block = args.get("grid", "?"), args.get("block", "?")
        lines.append(
            f"| {name[:100]} | {len(events) / steps:.1f} | {total / steps:.1f} | {total / len(events):.1f} | "
            f"{grid} | {block} | {args.get('est. achieved occupancy %', '?')} |"
        )
    return "\n".join(lines)


def kernel_family(name: str) -> str:
    """A kernel's family by its name: convolutions and matrix products (cuDNN, cuBLAS, CUTLASS, FFT convolutions),
    cuDNN's conversions between the NCHW layout and the NHWC one its kernels use, the kernels that ``torch.compile``
    generated (Triton: reductions, the batch norm's statistics among them, apart from pointwise ones), PyTorch's own
    reductions, and the rest (elementwise, copies)."""
    lowered = name.lower()
    if lowered.startswith(("triton_red", "triton_per")):
        return "triton reduction"
    if lowered.startswith("triton"):
        return "triton pointwise"
    if any(word in lowered for word in ("nchwtonhwc", "nhwctonchw", "converttensor")):
        return "layout"
    convolution = ("conv", "cudnn", "xmma", "gemm", "cutlass", "wgrad", "dgrad", "sm80", "sm90", "fft", "flip_filter")
    if any(word in lowered for word in convolution):
        return "conv/gemm"
    if "reduce" in lowered:
        return "reduction"
    return "other"


def bare_step(
    config: str, options: list[str], root_dir: str
) -> tuple[UnitsMAML, LightningDataModule, TaskBatch, torch.optim.Optimizer]:
    """A config's model, data module, first training batch and optimizer on the trainer's one device, as ``fit``
    builds them, for a bare step (``benchmarks.engines.step``): no logger, and the sampler's warm-up set to 0, so that
    every step scores and selects as a paper step does. ``options`` go to ``fit`` after those, and win over them."""
    cli = cli_main(
        ["--config", config, "--trainer.devices", "1", "--data.init_args.sampler.init_args.warmup_steps", "0",
         "--trainer.default_root_dir", root_dir, "--trainer.logger", "false", *options],
        run=False,
    )  # fmt: skip
    device = cli.trainer.strategy.root_device
    model, data = cli.model.to(device), cli.datamodule
    data.setup("fit")
    batch = data.transfer_batch_to_device(next(iter(data.train_dataloader())), device, 0)
    return model, data, batch, model.configure_optimizers()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the data module's root (e.g. the Omniglot zips)")
    parser.add_argument("--configs", nargs="+", default=["budget_omniglot_5w1s", "omniglot_20w1s"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, default=12, help="costliest kernels to list (0: none)")
    parser.add_argument(
        "--launches", type=int, default=0, help="costliest kernels of a training step with their launch grids (0: none)"
    )
    parser.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="after --: more fit options, e.g. -- --model.capture compile"
    )
    args = parser.parse_args(argv)
    overrides = [a for a in args.overrides if a != "--"]
    for name in args.configs:
        options = ["--data.init_args.root", args.root, "--trainer.accelerator", "gpu", *overrides]
        model, data, batch, optimizer = bare_step(f"configs/{name}.yaml", options, "/tmp/step_profile")
        device = model.device
        train = partial(step, model, batch, optimizer)
        print(f"== {name}: bare step {wall_ms(train, 10, args.repeats):.2f} ms wall")
        print("   " + kernels(train, 10, args.rows, args.launches))
        val = data.transfer_batch_to_device(next(iter(data.val_dataloader())), device, 0)
        model.eval()
        evaluate = partial(model.adapt_and_predict_sets, val.support_x, val.support_y, [val.query_x[:, 0]])
        print(f"== {name}: evaluation batch of {val.num_tasks} tasks {wall_ms(evaluate, 3, 10):.2f} ms wall")
        print("   " + kernels(evaluate, 5, args.rows))
        sync(device)


if __name__ == "__main__":
    main()

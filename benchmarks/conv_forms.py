"""The per-task 3x3 convolution of a second-order MAML step in two forms, timed alone at the shapes of the configs.

Under ``torch.func.vmap`` over tasks, a convolution whose weights differ per task becomes one grouped convolution
(cuDNN, or PyTorch's depthwise kernels for one input channel). The same product is a batched matrix product of the
images' 3x3 patches (``F.unfold``) with the weights. This times, per layer shape, the pattern of a MAML inner step and
its meta-gradient: ``torch.func.grad`` of a support loss through the convolution (create-graph, as the engine's
``vmap(grad(...))``), a query loss through the adapted weights, and the backward pass to the initial weights and the
images. Eager, and with ``--compile`` under ``torch.compile`` as the engine compiles its inner loop. On CUDA it prints
the kernels' GPU time beside the wall time: these steps are so small that an eager call is bound by the host (about
3.5 ms for every shape on an H200), while the engine replays its steps as CUDA graphs, which pay the GPU time alone.
``--check`` also compares the two forms' meta-gradients in float64.

    python benchmarks/conv_forms.py --device cuda [--compile] [--channels-last] [--cudnn-benchmark]
    python benchmarks/conv_forms.py --device cpu --check --warmup 1 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad, vmap
from torch.profiler import ProfilerActivity, profile

if not __package__:  # run as `python benchmarks/conv_forms.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engines import sync  # noqa: E402

# (name, tasks, images per task, in channels, height): Omniglot 20w1s at 8 tasks (a support or query set of 20),
# its scoring of 8 query sets at once (160), and the budget's 2 tasks of 5 images, layers 1-4.
SHAPES = [
    (f"{label} layer {i + 1}", tasks, images, 1 if i == 0 else 64, size)
    for label, tasks, images in (("20w1s", 8, 20), ("budget 5w1s", 2, 5))
    for i, size in enumerate((28, 14, 7, 3))
]


def grouped(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """One task's convolution (under vmap: a grouped convolution over the tasks)."""
    return F.conv2d(x, w, b, padding=1)


def patches(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """The same convolution as the weights times the images' 3x3 patches (under vmap: a batched matrix product)."""
    n, _, h, wd = x.shape
    cols = F.unfold(x, 3, padding=1)  # (N, C*9, H*W)
    out = w.flatten(1) @ cols  # (O, C*9) @ (N, C*9, H*W) -> (N, O, H*W)
    return out.view(n, -1, h, wd) + b.view(1, -1, 1, 1)


def meta_step(conv: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A one-layer MAML step for all tasks: adapt (w, b) on the support images with one second-order gradient step,
    then the query loss through the adapted weights; returns the mean query loss (to differentiate)."""

    def support_loss(w: Tensor, b: Tensor, x: Tensor) -> Tensor:
        return F.leaky_relu(conv(x, w, b)).square().mean()

    def task(w: Tensor, b: Tensor, xs: Tensor, xq: Tensor) -> Tensor:
        gw, gb = grad(support_loss, argnums=(0, 1))(w, b, xs)
        fast_w, fast_b = w - 0.4 * gw, b - 0.4 * gb
        return F.leaky_relu(conv(xq, fast_w, fast_b)).square().mean()

    def step(w: Tensor, b: Tensor, xs: Tensor, xq: Tensor) -> Tensor:
        tasks = xs.shape[0]
        return vmap(task)(w.expand(tasks, *w.shape), b.expand(tasks, *b.shape), xs, xq).mean()

    return step


def gpu_ms(fn: Callable[[], object], repeats: int) -> tuple[float, int]:
    """GPU time of ``fn``'s kernels and their count, per call (``torch.profiler``): what the step costs where it
    replays as a CUDA graph, without the host's launch work that an eager or compiled call pays here."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in events) / 1000 / repeats, round(len(events) / repeats)


def timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> str:
    """Wall milliseconds per call and, on CUDA, the GPU time and kernels per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    wall = (time.perf_counter() - start) / repeats * 1e3
    if device.type != "cuda":
        return f"{wall:7.3f} ms"
    busy, count = gpu_ms(fn, repeats)
    return f"{wall:7.3f} ms wall, {busy:6.3f} ms GPU in {count} kernels"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", action="store_true", help="compile the step's forward (with its inner grad)")
    parser.add_argument("--channels-last", action="store_true", help="images in channels-last memory")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--check", action="store_true", help="also check both forms agree in float64")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    print(f"device {device} compile {args.compile} channels_last {args.channels_last} cudnn_benchmark "
          f"{args.cudnn_benchmark} torch {torch.__version__}")  # fmt: skip
    for name, tasks, images, channels, size in SHAPES:
        generator = torch.Generator().manual_seed(0)
        w = (torch.randn(64, channels, 3, 3, generator=generator) / (3 * channels**0.5)).to(device).requires_grad_()
        b = torch.zeros(64, device=device, requires_grad=True)
        xs, xq = (torch.randn(tasks, images, channels, size, size, generator=generator).to(device) for _ in "sq")
        if args.channels_last:
            xs, xq = (x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, x.shape[:2])
                      for x in (xs, xq))  # fmt: skip
        if args.check:
            d = [t.detach().double().requires_grad_() for t in (w, b)]
            got = [torch.autograd.grad(meta_step(f)(*d, xs.double(), xq.double()), d) for f in (grouped, patches)]
            error = max((g - h).abs().max().item() for g, h in zip(*got, strict=True))
            print(f"  {name}: float64 meta-gradients differ by {error:.2e}")
        row = []
        for form, conv in (("grouped", grouped), ("patches", patches)):
            step = meta_step(conv)
            if args.compile:
                torch._dynamo.reset()  # one shape at a time: no recompile limit across the table
                step = torch.compile(step)
            row.append(f"{form} {timed(partial(meta_gradient, step, w, b, xs, xq), device, args.warmup, args.repeats)}")
        print(
            f"{name} ({tasks} tasks x {images} images, {channels} -> 64 channels at {size}x{size}): " + "; ".join(row)
        )


def meta_gradient(step: Callable[..., Tensor], w: Tensor, b: Tensor, xs: Tensor, xq: Tensor) -> None:
    """One meta-gradient of ``step`` into ``w`` and ``b``, cleared after."""
    step(w, b, xs, xq).backward()
    w.grad = b.grad = None


if __name__ == "__main__":
    main()

"""The batch norm's closed-form backward against autograd of its primitive form, in a whole training step.

A second-order MAML step differentiates the batch norm's backward once more; ``units_lightning.backbones.batch_norm``
writes that backward out (``batch_norm_primitive`` is the form autograd differentiated before). For each task shape
(``benchmarks/engines.py``'s, the Units-NTS step: 5 inner steps, learned per-layer per-step rates, per-step batch
norm), two models with the same weights, one per form, side by side in one process:

- the operations one training step dispatches (forward, backward, Adam; views not counted): on a GPU whose step is
  bound by its kernels, what a step costs;
- the largest difference of their float64 meta-gradients (eager, TF32 off), which must be rounding;
- on CUDA, ms a step with the inner loop as CUDA graphs (``capture: cuda_graph``), the two models taking turns.

    python benchmarks/batch_norm.py                                         # CPU: operations and the check
    python benchmarks/batch_norm.py --device cuda --shapes omniglot-5w1s omniglot-20w1s
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not __package__:  # run as `python benchmarks/batch_norm.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_name, versions  # noqa: E402
from benchmarks.engines import SHAPES, Shape, build, meta_gradient, random_batch, step, sync, time_steps  # noqa: E402
from units_lightning.backbones import BatchNorm, batch_norm_primitive  # noqa: E402
from units_lightning.module import UnitsMAML  # noqa: E402

VIEWS = frozenset(
    "view _unsafe_view expand as_strided unsqueeze squeeze permute transpose t slice select alias detach reshape "
    "_reshape_alias split unbind split_with_sizes unflatten lift_fresh".split()
)


class OperationCount(TorchDispatchMode):
    """Counts the ATen operations dispatched inside it, views left out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _primitive_forward(self: BatchNorm, x: torch.Tensor, step: int = 0) -> torch.Tensor:
    weight, bias = self.weight, self.bias
    if weight.dim() == 2:
        weight, bias = weight[min(step, weight.shape[0] - 1)], bias[min(step, bias.shape[0] - 1)]
    return batch_norm_primitive(x, weight, bias, self.eps)


def with_primitive_batch_norm(model: UnitsMAML) -> UnitsMAML:
    """The model with each of its batch norms differentiated by autograd of the primitive form (per instance)."""
    for module in model.modules():
        if isinstance(module, BatchNorm):
            module.forward = types.MethodType(_primitive_forward, module)
    return model


def models(shape: Shape, device: torch.device, capture: str) -> dict[str, UnitsMAML]:
    return {
        "primitive": with_primitive_batch_norm(build(shape, "batched", device, capture)),
        "closed form": build(shape, "batched", device, capture),  # the same seed: the same weights
    }


def operations(model: UnitsMAML, shape: Shape, device: torch.device) -> int:
    batch = random_batch(shape, 1, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step(model, batch, optimizer)  # first step: lazy state (Adam's moments) out of the count
    with OperationCount() as counter:
        step(model, batch, optimizer)
    return counter.count


def largest_difference(shape: Shape, device: torch.device) -> float:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    try:
        grads = []
        for model in models(shape, device, "none").values():
            model = model.double()
            batch = random_batch(shape, 1, device)
            batch = type(batch)(
                batch.support_x.double(), batch.support_y, batch.query_x.double(), batch.query_y, batch.classes
            )
            grads.append(meta_gradient(model, batch))
        return (grads[0] - grads[1]).abs().max().item()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, True


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", nargs="+", default=["omniglot-5w1s", "omniglot-20w1s"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    by_name = {shape.name: shape for shape in SHAPES}
    unknown = [name for name in args.shapes if name not in by_name]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {sorted(by_name)}")
    print(f"{device_name(device)} | {versions()}")
    print(
        "| shape (meta-batch) | operations a step: primitive / closed form | ratio | float64 meta-gradient, "
        "largest difference | ms a step, CUDA graphs: primitive / closed form | speed-up |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for name in args.shapes:
        shape = by_name[name]
        counts = {label: operations(model, shape, device) for label, model in models(shape, device, "none").items()}
        difference = largest_difference(shape, device)
        times = {}
        if device.type == "cuda":
            timed = models(shape, device, "cuda_graph")
            times = time_steps(timed, random_batch(shape, 1, device), device, args.warmup, args.repeats)
            sync(device)
        row = {
            "shape": name,
            "meta_batch": shape.meta_batch,
            "operations": counts,
            "difference": difference,
            "seconds": times,
        }
        rows.append(row)
        ms = f"{1000 * times['primitive']:.2f} / {1000 * times['closed form']:.2f}" if times else "(CUDA only)"
        speedup = f"{times['primitive'] / times['closed form']:.3f}x" if times else ""
        print(
            f"| {name} ({shape.meta_batch}) | {counts['primitive']} / {counts['closed form']} "
            f"| {counts['closed form'] / counts['primitive']:.3f} | {difference:.1e} | {ms} | {speedup} |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()

"""What crosses the processes of a data-parallel run: sums that do not stop the host, and epoch values logged once,
the same on every process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import Strategy
from torch import Tensor

__all__ = ["log_equal_on_every_rank", "sum_over_ranks", "weighted_means_over_ranks"]


def sum_over_ranks(tensor: Tensor, strategy: Strategy) -> Tensor:
    """``tensor`` summed over every process (in place, as ``Strategy.reduce``): one all-reduce, queued on the device.

    Not ``strategy.reduce`` itself: Lightning's reduce waits at ``torch.distributed.barrier`` first, which under
    NCCL blocks the host until the GPU has finished everything queued. Done once per training step (the
    ``NonFiniteGuard`` flag), that serialised the host's work with the GPU's and cost the 2-GPU speed-up
    (docs/SCALING.md). A strategy without a ``torch.distributed`` process group keeps its own reduce.
    """
    if not _distributed():
        return strategy.reduce(tensor, reduce_op="sum")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def weighted_means_over_ranks(totals: Mapping[str, tuple[Tensor, float]]) -> dict[str, Tensor]:
    """Weighted means over the steps of every process: each process's ``{name: (sum of value x weight, sum of
    weights)}`` (``RunningMeans.totals``) -> ``{name: sum over processes / weight over processes}``.

    Every name that any process has is in the result (a process may lack one: the rejected sets' uncertainty on a
    step that labeled all of its sets), except those whose weights sum to 0. The names are agreed first with one
    small all-gather of their lists, which waits for every process (call it once per epoch, not per step); one
    all-reduce then sums the sums and the weights, in float64. Outside a process group: the process's own means.

    Example:
        >>> {k: float(v) for k, v in weighted_means_over_ranks({"a": (torch.tensor(6.0), 3.0)}).items()}
        {'a': 2.0}
    """
    names = sorted(totals)
    if _distributed() and torch.distributed.get_world_size() > 1:
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, names)
        names = sorted(set().union(*gathered))
    if not names:
        return {}
    device = next(iter(totals.values()))[0].device if totals else _collective_device()
    zero = torch.zeros((), dtype=torch.float64, device=device)
    sums = torch.stack([totals[n][0].double() if n in totals else zero for n in names])
    weights = torch.tensor([totals[n][1] if n in totals else 0.0 for n in names], dtype=torch.float64, device=device)
    both = torch.cat([sums, weights])
    if _distributed():
        torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.SUM)
    sums, weights = both.split(len(names))
    return {n: (s / w).float() for n, s, w in zip(names, sums, weights.tolist(), strict=True) if w > 0}


def log_equal_on_every_rank(module: LightningModule, values: Mapping[str, float | Tensor], **options: Any) -> None:
    """``module.log_dict(values, **options)`` for epoch values that are already the same on every process: computed
    from metric states reduced across processes (torchmetrics' ``dist_reduce_fx``, ``all_gather``, the label
    ledger, ``weighted_means_over_ranks``).

    Every process logs them (callbacks such as ``ModelCheckpoint`` monitor them on every process), without another
    reduction and without Lightning's advice to pass ``sync_dist=True``: Lightning gives that advice for every
    epoch-level value logged with ``sync_dist=False`` under data-parallel training, and would otherwise average
    each value over the processes (a barrier and an all-reduce per name, for the same number). ``sync_dist=True``
    with ``rank_zero_only=True`` is Lightning's way to say "no reduction": its sync function is then a no-op.
    """
    module.log_dict(dict(values), sync_dist=True, rank_zero_only=True, **options)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _collective_device() -> torch.device:
    """Where this process's collectives run: its GPU under NCCL, else the CPU."""
    if _distributed() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

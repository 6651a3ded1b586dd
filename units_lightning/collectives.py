"""Sums across the processes of a data-parallel run that do not stop the host."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import Strategy
from torch import Tensor

__all__ = ["sum_over_ranks"]


def sum_over_ranks(tensor: Tensor, strategy: Strategy) -> Tensor:
    """``tensor`` summed over every process (in place, as ``Strategy.reduce``): one all-reduce, queued on the device.

    Not ``strategy.reduce`` itself: Lightning's reduce waits at ``torch.distributed.barrier`` first, which under
    NCCL blocks the host until the GPU has finished everything queued. Done once per training step (the
    ``NonFiniteGuard`` flag), that serialised the host's work with the GPU's and cost the 2-GPU speed-up
    (docs/SCALING.md). A strategy without a ``torch.distributed`` process group keeps its own reduce.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return strategy.reduce(tensor, reduce_op="sum")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor

"""The batched engine's inner loop replayed as CUDA graphs: the same kernels as eager, without the CPU overhead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call

from units_lightning.engines.base import InnerLoss

__all__ = ["GraphedInnerLoop"]


class GraphedInnerLoop:
    """Runs ``BatchedEngine``'s vectorised inner loop through ``torch.cuda.make_graphed_callables``.

    A second-order inner loop over a meta-batch of small tasks launches thousands of small kernels, and
    ``torch.func`` adds Python work to each: the GPU mostly waits for the CPU. Captured once per input
    signature (shapes, steps, order, loss object), the forward pass and its backward pass each replay as
    one CUDA graph. The meta-gradient flows through the graphed node as through any autograd function,
    to every engine parameter (backbone and learned inner rates), which enter the graph as inputs.

    The inner loss must read changing values (the eta schedule) from tensors whose storage stays put,
    since the graph reads them by address: ``UnitsMAML`` keeps eta in a buffer for that reason.

    Each signature holds its own graphs and memory pool; past ``max_graphs`` signatures (a meta-batch
    whose shape keeps changing) new ones run eagerly instead, with one warning.

    Args:
        engine: the ``BatchedEngine``; its ``forward(support_x, support_y, loss, steps, create_graph)``
            returns the fast weights as a tuple.
        max_graphs: signatures to capture at most.
    """

    def __init__(self, engine: nn.Module, max_graphs: int = 4):
        self.engine = engine
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, Callable[..., Any]] = {}
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Captured graphs belong to this engine's parameters and memory: a copy (an ensemble member, a pickled
        # model) starts without them and captures its own.
        return {**self.__dict__, "_graphs": {}, "_warned": False}

    def __call__(self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool):
        names, params = zip(*self.engine.named_parameters(), strict=True)
        key = (
            support_x.shape,
            support_x.dtype,
            support_x.device,
            support_y.shape,
            steps,
            create_graph,
            id(loss),
            torch.is_autocast_enabled("cuda"),
        )
        graphed = self._graphs.get(key)
        if graphed is None and len(self._graphs) >= self.max_graphs:
            if not self._warned:
                rank_zero_warn(
                    f"the inner loop was captured for {self.max_graphs} input shapes already; new shapes run "
                    "eagerly (keep the meta-batch shape fixed, or set model.capture=none)"
                )
                self._warned = True
            return self.engine(support_x, support_y, loss, steps, create_graph)
        if graphed is None:
            # Capture with aliases of the parameters (same storage, so replays read the live weights): the captured
            # graph, kept alive, then holds the aliases' gradient accumulators, not the parameters'. Holding those
            # would pin them to the capture's side stream, and every later backward would warn of a stream mismatch
            # and synchronise the streams.
            aliases = [p.detach().requires_grad_(p.requires_grad) for p in params]
            graphed = torch.cuda.make_graphed_callables(
                self.functional(names, loss, steps, create_graph),
                (support_x, support_y, *aliases),
                allow_unused_input=True,
            )
            self._graphs[key] = graphed
        return graphed(support_x, support_y, *params)

    def functional(self, names: tuple[str, ...], loss: InnerLoss, steps: int, create_graph: bool) -> Callable:
        """The inner loop as a function of tensors only (images, labels, then every engine parameter)."""

        def inner_loop(support_x: Tensor, support_y: Tensor, *params: Tensor) -> tuple[Tensor, ...]:
            weights = dict(zip(names, params, strict=True))
            return functional_call(self.engine, weights, (support_x, support_y, loss, steps, create_graph))

        return inner_loop

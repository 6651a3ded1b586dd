"""CUDA graphs for the batched engine: the same kernels as eager, replayed without the CPU overhead.

Three users share one mechanism (``GraphedCalls``): the inner loop of a training step (``GraphedInnerLoop``), the
whole forward pass of a training step (``captured_step.CapturedStep``: inner loop, scoring, selection, query loss;
captured with its backward pass) and evaluation (``GraphedInference``: adaptation and prediction, no backward pass).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call

from units_lightning.engines.base import InnerLoss

__all__ = ["GraphedCalls", "GraphedInference", "GraphedInnerLoop", "addresses", "state_of"]


def state_of(*modules: object) -> list[Tensor]:
    """The parameters and buffers of each ``nn.Module`` among ``modules`` (others are skipped): what a captured
    function reads by address besides its inputs."""
    return [t for m in modules if isinstance(m, nn.Module) for t in (*m.parameters(), *m.buffers())]


def addresses(tensors: Iterable[Tensor]) -> tuple[tuple[torch.device, int], ...]:
    """Where ``tensors`` live. A graph reads by address, so a graph captured elsewhere must not be replayed: moving a
    module (Lightning moves it to the CPU after ``fit`` and back for ``test``) gives its tensors new storage, and a
    replay would read freed memory."""
    return tuple((t.device, t.data_ptr()) for t in tensors)


class _Bound(nn.Module):
    """``fn(*inputs)`` as the forward of a module that holds ``module``, so that ``functional_call`` can run it with
    the module's parameters swapped for explicit inputs (named ``module.<name>``)."""

    def __init__(self, module: nn.Module, fn: Callable[..., tuple[Tensor, ...]]):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self.fn(*inputs)


class GraphedCalls:
    """Functions of tensors and of a module's parameters, each captured once per key and replayed as CUDA graphs.

    ``torch.cuda.make_graphed_callables`` captures the forward pass and its backward pass; the gradient reaches every
    parameter of ``module`` (which enter the graph as inputs) through the graphed node as through any autograd
    function, so ``loss.backward()``, the optimizer and data-parallel gradient hooks work unchanged.

    The captured function must not read the device from the host, and must read changing values from tensors whose
    storage stays put (the graph reads them by address: ``reads``). Where the module's tensors or ``reads`` have
    moved since a key's capture, that key is captured anew. Each key holds its own graphs and memory pool; past
    ``max_graphs`` keys, ``__call__`` returns None (the caller runs eagerly) and warns once.

    Args:
        module: whose parameters the functions use.
        max_graphs: keys to capture at most.
        what: what is captured, for the warning.
    """

    def __init__(self, module: nn.Module, max_graphs: int = 4, what: str = "the inner loop"):
        self.module, self.max_graphs, self.what = module, max_graphs, what
        self._graphs: dict[Hashable, tuple[Callable[..., Any], tuple]] = {}
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Captured graphs belong to this module's parameters and memory: a copy (an ensemble member, a pickled model)
        # starts without them and captures its own.
        return {**self.__dict__, "_graphs": {}, "_warned": False}

    def __call__(
        self,
        key: Hashable,
        fn: Callable[..., tuple[Tensor, ...]],
        inputs: Sequence[Tensor],
        reads: Sequence[Tensor] = (),
    ) -> tuple[Tensor, ...] | None:
        """``fn(*inputs)`` (a tuple of tensors) replayed from the graph of ``key``, captured at its first call.

        ``reads`` are the tensors that ``fn`` reads by address besides its inputs and the module's parameters and
        buffers (a loss's buffers).

        Returns:
            the outputs, which the next replay of the same key overwrites (clone what must outlive it); None once
            ``max_graphs`` other keys are captured: run ``fn`` eagerly then.
        """
        names, params = zip(*self.module.named_parameters(), strict=True)
        where = addresses((*params, *self.module.buffers(), *reads))  # state_of's order, the parameters read once
        graphed, captured_at = self._graphs.pop(key, (None, where))
        if captured_at != where:
            graphed = None  # captured before its tensors moved: capture anew, in its place
        if graphed is None:
            if len(self._graphs) >= self.max_graphs:
                if not self._warned:
                    rank_zero_warn(
                        f"{self.what} was captured as CUDA graphs for {self.max_graphs} input shapes already; new "
                        "shapes run eagerly (keep the meta-batch shape fixed, or set model.capture=none)"
                    )
                    self._warned = True
                return None
            # Capture with aliases of the parameters (same storage, so replays read the live weights): the captured
            # graph, kept alive, then holds the aliases' gradient accumulators, not the parameters'. Holding those
            # would pin them to the capture's side stream, and every later backward would warn of a stream mismatch
            # and synchronise the streams.
            aliases = [p.detach().requires_grad_(p.requires_grad) for p in params]
            with _quiet_stream_check():
                graphed = torch.cuda.make_graphed_callables(
                    self.functional(names, fn, len(inputs)), (*inputs, *aliases), allow_unused_input=True
                )
        self._graphs[key] = (graphed, where)
        return graphed(*inputs, *params)

    def functional(self, names: tuple[str, ...], fn: Callable[..., Any], num_inputs: int) -> Callable[..., Any]:
        """``fn`` as a function of tensors only: its inputs, then every parameter of the module (what is captured)."""
        bound = _Bound(self.module, fn)

        def call(*tensors: Tensor) -> tuple[Tensor, ...]:
            weights = {f"module.{name}": p for name, p in zip(names, tensors[num_inputs:], strict=True)}
            return functional_call(bound, weights, tuple(tensors[:num_inputs]), strict=False)

        return call


@contextmanager
def _quiet_stream_check() -> Iterator[None]:
    """No AccumulateGrad stream-mismatch warning during a capture. The capture runs the function and its backward on a
    side stream, once; a scored training step then warns once, inside the capture. Replays do not warn (they would at
    every step if a parameter's gradient accumulator were bound to the side stream): tests/engines/test_captured_step.py
    checks every step after the capture."""
    toggle = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
    if toggle is None:
        yield
        return
    toggle(False)
    try:
        yield
    finally:
        toggle(True)


class GraphedInnerLoop:
    """Runs ``BatchedEngine``'s vectorised inner loop through ``GraphedCalls``.

    A second-order inner loop over a meta-batch of small tasks launches thousands of small kernels, and
    ``torch.func`` adds Python work to each: the GPU mostly waits for the CPU. Captured once per input
    signature (shapes, steps, order, loss object), the forward pass and its backward pass each replay as
    one CUDA graph. The meta-gradient flows through the graphed node to every engine parameter (backbone and
    learned inner rates).

    The inner loss must read changing values (the eta schedule) from tensors whose storage stays put,
    since the graph reads them by address: ``UnitsMAML`` keeps eta in a buffer for that reason.

    Args:
        engine: the ``BatchedEngine``; its ``forward(support_x, support_y, loss, steps, create_graph)``
            returns the fast weights as a tuple.
        max_graphs: signatures to capture at most.
    """

    def __init__(self, engine: nn.Module, max_graphs: int = 4):
        self.engine = engine
        self.calls = GraphedCalls(engine, max_graphs, "the inner loop")

    def __call__(self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool):
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
        fn = lambda x, y: self.engine(x, y, loss, steps, create_graph)  # noqa: E731
        fast = self.calls(key, fn, (support_x, support_y), state_of(loss))
        return self.engine(support_x, support_y, loss, steps, create_graph) if fast is None else fast


class GraphedInference:
    """Functions without a backward pass (evaluation: adapt, then predict) captured with ``torch.cuda.graph`` per key.

    The function reads the module's weights by address (``reads``), so replays see the current weights; where they
    have moved since a key's capture (the module went to another device and back), that key is captured anew. The
    outputs are cloned out of the graph's memory, so they outlive the next replay.

    If a capture fails, that function runs eagerly from then on (``__call__`` returns None), after one warning.

    Args:
        max_graphs: keys to capture at most; past it ``__call__`` returns None (run eagerly).
    """

    def __init__(self, max_graphs: int = 4):
        self.max_graphs = max_graphs
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, list[Tensor], tuple[Tensor, ...], tuple]] = {}
        self.failed = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_graphs": {}}

    def __call__(
        self, key: Hashable, fn: Callable[..., tuple[Tensor, ...]], inputs: Sequence[Tensor], reads: Sequence[Tensor]
    ) -> tuple[Tensor, ...] | None:
        """``fn(*inputs)`` replayed from the graph of ``key`` (captured at its first call), where ``reads`` are the
        tensors that ``fn`` reads by address besides its inputs (the weights); None where it runs eagerly."""
        where = addresses(reads)
        captured = self._graphs.get(key)
        if captured is not None and captured[3] != where:
            del self._graphs[key]  # captured before the weights moved: it would read freed memory
            captured = None
        if captured is None:
            if len(self._graphs) >= self.max_graphs or self.failed:
                return None
            try:
                captured = self._capture(key, fn, inputs, where)
            except Exception as error:  # noqa: BLE001 - whatever keeps it from capturing, it still runs eagerly
                rank_zero_warn(
                    f"capturing evaluation as a CUDA graph failed ({type(error).__name__}: {error}); it runs eagerly "
                    "from now on (model.capture=none skips the attempt)"
                )
                self.failed = True
                return None
        graph, static, outputs, _ = captured
        for buffer, x in zip(static, inputs, strict=True):
            buffer.copy_(x)
        graph.replay()
        return tuple(o.clone() for o in outputs)

    def _capture(
        self, key: Hashable, fn: Callable[..., tuple[Tensor, ...]], inputs: Sequence[Tensor], where: tuple
    ) -> tuple[torch.cuda.CUDAGraph, list[Tensor], tuple[Tensor, ...], tuple]:
        static = [x.clone() for x in inputs]
        # As torch.cuda.make_graphed_callables: warm-up (lazy initialisation, cuDNN's choices) and capture on one
        # side stream, the device idle in between.
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*static)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            outputs = fn(*static)
        self._graphs[key] = (graph, static, outputs, where)
        return self._graphs[key]

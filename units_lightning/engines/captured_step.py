"""A training step replayed as CUDA graphs, and the ``capture="auto"`` policy that decides how the engine captures.

``CapturedStep`` takes Algorithm 1's forward pass (``UnitsMAML._forward_pass``: adapt, score, select, reveal, loss,
the logged values) as a function of tensors and replays it, with its backward pass, from CUDA graphs captured by
``cuda_graph.GraphedCalls``: the same kernels as eager, without the host's work of launching them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal, NamedTuple, Protocol

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from torch import Tensor, nn

from units_lightning.belief import TaskBeliefs
from units_lightning.engines.base import CapturingEngine
from units_lightning.engines.cuda_graph import GraphedCalls, state_of
from units_lightning.episode import SealedLabels, TaskBatch
from units_lightning.ledger import LabelLedger, Revealed

__all__ = ["COMPILE_MIN_STEPS", "WARM_COMPILE_MIN_STEPS", "CapturedStep", "ForwardPass", "MetaStep", "auto_capture"]

COMPILE_MIN_STEPS = 20_000
"""Training steps from which ``capture="auto"`` compiles a single-GPU run: compiling costs minutes once and saves a
share of every step, so a run of this length pays it back (docs/PERFORMANCE.md has the measurements)."""

WARM_COMPILE_MIN_STEPS = 2_000
"""Training steps from which ``capture="auto"`` compiles a single-GPU run whose signature compiled on this machine
before (``compile_cache.compiled_before``): loading the compiled kernels from the cache costs about 9 s once, and
on an H200 a compiled ``budget_omniglot_5w1s`` step is 7.6 ms shorter than a CUDA-graph one (5.62 against 13.18 ms,
docs/PERFORMANCE.md), so about 1,200 steps pay it back."""


def auto_capture(steps: float, world_size: int, compiled_before: bool = False) -> Literal["cuda_graph", "compile"]:
    """What ``capture="auto"`` does in a CUDA fit of ``steps`` optimizer steps over ``world_size`` processes:
    "compile" for a long run on one GPU (the paper's 50,000 steps), and for a run of ``WARM_COMPILE_MIN_STEPS`` or
    more on one GPU that ``compiled_before`` on this machine (its kernels come from the compile cache); else
    "cuda_graph": shorter runs (a first label-budget run of 5,000 steps is over before compiling pays back) and data
    parallelism."""
    if world_size != 1:
        return "cuda_graph"
    warm = compiled_before and steps >= WARM_COMPILE_MIN_STEPS
    return "compile" if steps >= COMPILE_MIN_STEPS or warm else "cuda_graph"


say = rank_zero_only(print)


class MetaStep(NamedTuple):
    """What the forward pass of a training step computed, K of T x Q query sets labeled."""

    loss: Tensor
    scores: Tensor
    """(T, Q) task uncertainty of every candidate set (zeros when not scored)."""
    chosen: Tensor
    """(T, Q) bool: the labeled sets."""
    labels: Tensor
    """(K, M) their labels."""
    queries: TaskBeliefs
    """(K, M) vacuity, dissonance, incorrect and correct belief of every labeled query."""
    correct: Tensor
    """(K, M) bool."""
    values: dict[str, Tensor]
    """The step's logged means (``train/loss``, ``train/acc``, the beliefs, the selection's uncertainty)."""


class ForwardPass(Protocol):
    """Algorithm 1's forward pass over a batch, with lambda and eta (floats, or 0-d tensors inside a capture), whether
    the candidates are scored, the sampler's declared count of chosen sets, and ``reveal(chosen)``, which opens the
    chosen sets' labels (None: the ledger's, which counts them and trims the choice to the label budget)."""

    def __call__(
        self,
        batch: TaskBatch,
        lam: float | Tensor,
        eta: float | Tensor,
        scored: bool,
        count: int | None,
        reveal: Callable[[Tensor], Revealed] | None = None,
    ) -> MetaStep: ...


class CapturedStep:
    """A training step's forward pass replayed from CUDA graphs, captured with its backward pass at the first call
    per shape and branch.

    A step replays on CUDA around an engine that ``captures`` (``CapturingEngine``), with grad enabled and a sampler
    that declares how many sets it chooses (``chosen_count``), except a step that the label budget trims (the last
    one of a budget run may label fewer sets: it runs eagerly). Inside the graph the labels are opened with
    ``LabelLedger.open_chosen``; outside, ``LabelLedger.record`` counts them from shapes. Lambda and eta reach the
    graph through a device tensor written with ``fill_`` (no copy, no wait). Where capturing fails, the run steps
    eagerly from then on, after one warning.

    Args:
        engine: the model's engine: its parameters enter the graphs as inputs (the meta-gradient reaches them through
            one autograd node), and its inner loop runs eagerly inside the capture.
        reads: modules whose parameters and buffers the forward pass reads by address besides the engine's (the
            inner loss, whose eta buffer is written in place).
    """

    def __init__(self, engine: nn.Module, reads: Sequence[nn.Module] = ()):
        self.engine, self.reads = engine, tuple(reads)
        self.graphs: GraphedCalls | bool | None = None  # None until the first capture; False once capturing failed
        self._scalars: Tensor | None = None  # lambda and eta, where the graphs read them
        self._value_names: dict[tuple, list[str]] = {}

    def applies(self, batch: TaskBatch, count: int | None, ledger: LabelLedger) -> bool:
        """Whether this step replays as a CUDA graph (see the class)."""
        if not isinstance(self.engine, CapturingEngine) or not self.engine.captures or self.graphs is False:
            return False
        if not batch.support_x.is_cuda or count is None or not torch.is_grad_enabled():
            return False
        share = ledger.share
        return share is None or count <= share  # a step that the budget trims runs eagerly

    def __call__(
        self,
        forward: ForwardPass,
        batch: TaskBatch,
        ledger: LabelLedger,
        lam: float,
        eta: float,
        scored: bool,
        count: int | None,
        variant: tuple = (),
    ) -> MetaStep | None:
        """``forward(batch, lam, eta, scored, count)`` replayed from its CUDA graph, its labels counted in ``ledger``;
        None where the step runs eagerly instead (``applies`` does not hold, every graph is taken, or capturing
        failed). ``variant`` holds what else changes the captured function, beyond the shapes and branch (the
        sampler's warm-up, the inner steps, the order)."""
        if not self.applies(batch, count, ledger):
            return None
        sealed = batch.query_y._labels  # opened inside the graph by LabelLedger.open_chosen, counted below
        if sealed.device != batch.support_x.device:
            return None
        if self.graphs is None:
            self.graphs = GraphedCalls(self.engine, what="the training step")
        x = batch.support_x
        if self._scalars is None or (self._scalars.dtype, self._scalars.device) != (x.dtype, x.device):
            self._scalars = x.new_zeros(2)  # in the images' precision: lambda and eta as eager uses them
        self._scalars[0].fill_(lam)
        self._scalars[1].fill_(eta)
        key = (x.shape, batch.query_x.shape, sealed.shape, x.dtype, scored, count, *variant)
        key += (torch.is_autocast_enabled("cuda"),)
        function, names = self.function(forward, batch.classes, scored, count)
        inputs = (x, batch.support_y, batch.query_x, sealed, self._scalars)
        try:
            outputs = self.graphs(key, function, inputs, state_of(*self.reads))
        except Exception as error:  # noqa: BLE001 - whatever keeps the step from capturing, it still runs eagerly
            rank_zero_warn(
                f"capturing the training step as a CUDA graph failed ({type(error).__name__}: {error}); this run steps "
                "eagerly from now on (model.capture=none skips the attempt)"
            )
            self.graphs = False
            return None
        if outputs is None:
            return None
        if names:  # filled where the function ran: at the capture
            self._value_names[key] = list(names)
        ledger.record(batch, outputs[2], count)
        loss, *rest = outputs
        scores, chosen, labels, vac, dis, inc, cor, correct, *values = (t.detach().clone() for t in rest)  # outlive it
        named = dict(zip(self._value_names[key], values, strict=True))
        return MetaStep(loss, scores, chosen, labels, TaskBeliefs(vac, dis, inc, cor), correct, named)

    def function(
        self, forward: ForwardPass, classes: Tensor, scored: bool, count: int | None
    ) -> tuple[Callable[..., tuple[Tensor, ...]], list[str]]:
        """``forward`` as a function of tensors only (what is captured): (support_x, support_y, query_x, query labels,
        [lambda, eta]) -> (loss, scores, chosen, labels, the four beliefs, correct, *values). The list it returns
        receives the values' names when the function runs."""
        names: list[str] = []

        def tensors(support_x: Tensor, support_y: Tensor, query_x: Tensor, query_y: Tensor, scalars: Tensor):
            episode = TaskBatch(support_x, support_y, query_x, SealedLabels(query_y), classes)
            reveal = partial(LabelLedger.open_chosen, query_y, count=count)
            with self.engine.eager():  # graphs do not nest: the engine's own are off inside this one
                step = forward(episode, scalars[0], scalars[1], scored, count, reveal=reveal)
            names[:] = list(step.values)
            values = step.values.values()
            return (step.loss, step.scores, step.chosen, step.labels, *step.queries, step.correct, *values)

        return tensors, names

    def resolve_auto(
        self, trainer: pl.Trainer, device: torch.device, compiled_before: Callable[[], bool] = lambda: False
    ) -> bool:
        """``capture="auto"`` on CUDA: compile a long single-GPU run, or a shorter one that ``compiled_before`` on this
        machine (``auto_capture``; the callable is asked only for such a run). Called when training starts, where the
        training loader (and so the run's length) is known without loading it early. Returns whether this run steps
        with CUDA graphs only because it did not compile here before: the same run would compile once it has (a
        ``CompileForNextRun`` callback then compiles it for the next run, in the background)."""
        if not isinstance(self.engine, CapturingEngine) or self.engine.capture != "auto" or device.type != "cuda":
            return False
        steps, world_size = trainer.estimated_stepping_batches, trainer.world_size
        # The records are read only where they decide: a run that compiles, or does not, whatever they say is not warm.
        decides = auto_capture(steps, world_size, compiled_before=True) != auto_capture(steps, world_size)
        warm = decides and compiled_before()
        if auto_capture(steps, world_size, warm) == "compile":
            say(  # printed: the command line's quiet display hides Lightning's info messages
                f"capture auto: compiling the inner loop for this run of {steps:,.0f} steps "
                + (
                    "(these shapes compiled on this machine before: from the compile cache, in seconds; "
                    if warm
                    else "(about 2 minutes the first time on this machine, then from the compile cache; "
                )
                + "model.capture=cuda_graph skips it)",
                flush=True,
            )
            self.engine.use_capture("compile")
        return decides and not warm

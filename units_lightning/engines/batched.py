"""The fast engine: every task of a meta-batch adapted at once with ``torch.func`` (``grad`` inside ``vmap``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from units_lightning.compile_cache import use_compile_cache
from units_lightning.conv_grads import WeightGradientPass
from units_lightning.engines.ahead import AheadCompiled
from units_lightning.engines.base import InnerLoss, accepts_step, inner_loop_parameters, per_step_slices
from units_lightning.engines.cuda_graph import GraphedInference, GraphedInnerLoop, state_of
from units_lightning.engines.inner_lr import InnerLearningRates, InnerLRMode

__all__ = ["AdaptedWeights", "BatchedEngine"]


@dataclass
class AdaptedWeights:
    """What ``BatchedEngine.adapt`` returns: the tasks' fast weights, stacked along a leading task dimension.

    Attributes:
        fast: name -> (T, ...) adapted weights of the inner-loop parameters.
        steps: inner steps taken (selects the per-step batch-norm weights used for prediction).
    """

    fast: dict[str, Tensor]
    steps: int


class BatchedEngine(nn.Module):
    """Second- or first-order MAML over a batch of tasks in one vectorised pass.

    ``adapt`` maps the per-task inner loop (``torch.func.grad`` of the support loss, then
    ``w - lr * g``, ``steps`` times) over the tasks with ``torch.func.vmap``; the meta-gradient flows back
    through it with ordinary autograd. ``predict`` maps the forward pass over query sets, each with its
    task's fast weights. It computes the same quantities as ``Learn2LearnEngine`` (checked to 1e-10 in
    float64, tests/engines), without one kernel launch sequence per task.

    The backbone's batch norm must be written from primitive operations (``backbones.BatchNorm``):
    ``nn.BatchNorm2d`` under ``vmap`` gives wrong second-order meta-gradients.

    Args:
        model: the backbone whose initialisation is meta-learned.
        inner_lr: inner-loop learning rate (the initial one when learned).
        inner_lr_mode: "fixed" (MAML), "per_layer_per_step" (MAML++) or "per_parameter" (Meta-SGD).
        inner_steps: inner steps in training (sizes per-step rates).
        chunk_size: tasks (in ``adapt``) or query sets (in ``predict``) vectorised at once; None for all.
            Smaller chunks bound the memory of evaluation and scoring; training memory still grows with
            the meta-batch because the graph of every task is kept for the backward pass (split the
            meta-batch with the trainer's ``accumulate_grad_batches`` instead).
        capture: how the inner loop runs: "auto" (CUDA graphs on CUDA; ``UnitsMAML`` turns it into
            "compile" for long runs, ``use_capture``), "none" (eager), "cuda_graph" (``GraphedInnerLoop``) or
            "compile" (``torch.compile`` of the vectorised inner loop and query predictions of training, their
            float64 meta-gradient equal to eager's within 1e-10, ``tests/engines/test_compiled_inner_loop.py`` and,
            on a GPU, ``tests/engines/test_captured_step.py``; on CUDA ``UnitsMAML`` replays the whole step, compiled
            kernels included, as a CUDA graph; where compiling fails, the engine warns once and goes on as
            "cuda_graph"). Evaluation (the engine in eval mode) runs uncompiled under every capture, as CUDA graphs
            on CUDA: compiling its first-order loop costs far more than it saves over a run's validations
            (docs/PERFORMANCE.md).
        vectorize: "auto" (vectorise over tasks on CUDA, loop over them on CPU, where ``vmap``'s grouped
            convolutions are slower; under ``capture="compile"`` vectorise everywhere), True or False. The loop
            cannot be compiled: its second-order gradients come from ``torch.autograd.grad(create_graph=True)``,
            a double backward that ``torch.compile`` does not support, so "compile" refuses False.
        compile_scoring: compile the scoring of candidate query sets (training, no gradient) with
            ``torch.compile``: "auto" (on CUDA where ``capture`` is, or has been resolved to, "compile": a long
            run; a short one, such as a label-budget run, is over before its compiling pays back), True or False.
            It is a forward pass only, whose batch norm, activation and pooling fuse into a few kernels (it pays on
            large query sets). If compiling fails (no Triton or C++ compiler), scoring runs eagerly after one
            warning. False leaves the scoring to the predictions' function (``_compiled_predict_sets``), which
            "compile" compiles with every task vectorised (grouped convolutions): on Omniglot 20w1s's small query
            sets 1.05x a scoring step over the pass of its own (docs/PERFORMANCE.md).
        compile_inner: what one compiled graph of the inner loop holds under ``capture="compile"``: "loop" (all
            ``steps`` inner steps unrolled, one graph) or "step" (one inner step, a graph called ``steps`` times).
            Both give the same meta-gradients (float64, ``tests/engines/test_compiled_inner_loop.py``); "step"
            traces and compiles one step's graph instead of all of them (on 2 CPU cores a 3-step model reached its
            first step in 76 s instead of 145 s) and gives up fusing across the steps' boundaries
            (docs/PERFORMANCE.md, "Compiling one inner step"). A backbone that lists its per-step weights
            (``per_step_parameters``, as ``ConvNet``) gets them as inputs and compiles one graph; one that reads
            ``step`` otherwise compiles one per step.
        compile_channels_last: compile with inductor's channels-last layout forced
            (``force_layout_optimization``) for the inner loop, predictions and scoring, so that cuDNN's grouped
            convolutions under ``vmap`` skip their layout conversions; pair it with ``trainer.benchmark: true`` (cuDNN
            picks its algorithms by timing). On an H200, ``omniglot_20w1s`` compiled took 12.54 / 13.98 ms a step
            (before / after selection starts) with both, 14.76 / 16.25 with neither, and 17.01 / 18.53 with the
            layout alone, which is why the engine warns once when it runs on CUDA without cuDNN's benchmark
            (docs/PERFORMANCE.md). The same meta-gradients in float64 (``tests/engines/test_compiled_inner_loop.py``).
        compile_ahead: compile with ``torch.compile(...).aot_compile`` (experimental in torch; torch 2.11 works
            with what ``units_lightning.engines.ahead`` adds) and keep each compiled function whole (graphs, kernels
            and guards) in the compile cache, so that a later run on the machine loads it instead of tracing it
            again: a warm budget run's one-off 13.3-15.2 s -> 8.6-12.5 s on an H200. Falls back to plain compiling,
            after one message, where torch cannot (each saved artifact is loaded back once to check).
        compile_options: Inductor options (``torch._inductor.config`` names, as ``torch.compile(options=...)``) for
            every compiled function, over the engine's own (``compile_channels_last``'s layout, ``explicit_conv_grads``'
            graph pass), e.g. ``{"combo_kernels": True}``; an unknown name is refused when the engine is built.
    """

    def __init__(
        self,
        model: nn.Module,
        inner_lr: float = 0.1,
        inner_lr_mode: InnerLRMode = "fixed",
        inner_steps: int = 1,
        chunk_size: int | None = None,
        capture: Literal["auto", "none", "cuda_graph", "compile"] = "auto",
        vectorize: bool | Literal["auto"] = "auto",
        compile_scoring: bool | Literal["auto"] = "auto",
        compile_inner: Literal["loop", "step"] = "loop",
        compile_channels_last: bool = False,
        compile_ahead: bool = False,
        compile_options: dict[str, Any] | None = None,
    ):
        super().__init__()
        for name, value in (("compile_channels_last", compile_channels_last), ("compile_ahead", compile_ahead)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.compile_channels_last = compile_channels_last
        self.compile_ahead = compile_ahead
        self.compile_options = check_inductor_options(compile_options)
        self._layout_checked = False  # the pairing with cuDNN's benchmark, checked at the first compiled call
        if compile_inner not in ("loop", "step"):
            raise ValueError(f"compile_inner must be 'loop' or 'step', got {compile_inner!r}")
        if capture not in ("auto", "none", "cuda_graph", "compile"):
            raise ValueError(f"capture must be 'auto', 'none', 'cuda_graph' or 'compile', got {capture!r}")
        _check_compilable(capture, vectorize)
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive number of tasks or None, got {chunk_size}")
        for name, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                raise ValueError(
                    f"{name} is a {type(module).__name__}: under torch.func.vmap it gives wrong second-order "
                    "meta-gradients. Use units_lightning.backbones.BatchNorm or model.engine=learn2learn"
                )
        self.model = model
        self.inner_lr = InnerLearningRates(inner_loop_parameters(model), inner_lr, inner_lr_mode, inner_steps)
        self.chunk_size = chunk_size
        self._step_kwarg = accepts_step(model)
        # its per-step weights come as inputs (``per_step_slices``): the step number changes nothing else
        self._steps_in_weights = hasattr(model, "per_step_parameters")
        self.compile_inner = compile_inner
        self.capture = capture
        self.vectorize = vectorize
        self._bind_capture()
        self._graphs_suspended = False  # inside ``eager()``
        if compile_scoring not in ("auto", True, False):
            raise ValueError(f"compile_scoring must be 'auto', True or False, got {compile_scoring!r}")
        self.compile_scoring = compile_scoring
        self._compiled_scoring: Any = None  # built at first use; False once compiling failed

    _COMPILED_FUNCTIONS = ("_compiled_adapt", "_compiled_step", "_compiled_predict", "_compiled_predict_sets")

    def _bind_functions(self) -> None:
        """The inner loop and predictions: compiled under ``capture="compile"`` (for the engine in train mode,
        ``_compiling``), else the methods themselves. Each compiled function wraps this instance's bound method."""
        compile = self.capture == "compile"
        stepwise = compile and self.compile_inner == "step"
        self._compiled_step = self._compiling(self._inner_step) if stepwise else self._inner_step
        if stepwise:
            self._compiled_adapt = self._adapt_stepwise
        else:
            self._compiled_adapt = self._compiling(self._adapt_all) if compile else self._adapt_all
        self._compiled_predict = self._compiling(self._predict_all) if compile else self._predict_all
        self._compiled_predict_sets = self._compiling(self._predict_sets) if compile else self._predict_sets

    def _bind_capture(self) -> None:
        """The functions and graphs of ``capture``: the inner-loop graphs under "auto" and "cuda_graph" (under
        "compile" its compiled kernels run inside the caller's whole-step graph), fresh evaluation graphs under every
        capture but "none" (graphs captured from other functions are never replayed)."""
        self._bind_functions()
        self._graphed = GraphedInnerLoop(self) if self.capture in ("auto", "cuda_graph") else None
        self._graphed_evaluation = GraphedInference() if self.captures else None

    def _compiling(self, function: Any) -> Any:
        """``torch.compile(function)`` for the engine in train mode, falling back for good to CUDA graphs of the
        uncompiled function (after one warning) where compiling fails: no Triton or C++ compiler, or an operation the
        compiler rejects. In eval mode (validation, test, predict) ``function`` runs uncompiled: compiling the
        first-order evaluation loop costs more than it saves (docs/PERFORMANCE.md). What it compiles is kept for the
        next run on this machine (``use_compile_cache``)."""
        compiled = self._compile(function)

        def run(*args: Any) -> Any:  # after a failure ``use_capture`` binds the uncompiled functions in its place
            if not self.training:
                return function(*args)
            if not self._layout_checked:
                self._check_layout()
            try:
                return compiled(*args)
            except Exception as error:  # noqa: BLE001 - the uncompiled function raises again what is not the compiler's
                rank_zero_warn(
                    f"compiling the inner loop failed ({type(error).__name__}: {error}); it runs uncompiled from now "
                    "on (model.capture=cuda_graph skips the attempt)"
                )
                self.use_capture("cuda_graph")
                return function(*args)

        run.compiled = compiled  # type: ignore[attr-defined]
        return run

    def _compile(self, function: Any, dynamic: bool | None = None) -> Any:
        """``torch.compile(function)`` with the engine's options: the channels-last layout forced under
        ``compile_channels_last``, saved and loaded whole under ``compile_ahead``; into the lasting compile cache."""
        use_compile_cache()
        options: dict[str, Any] = {"force_layout_optimization": True} if self.compile_channels_last else {}
        if getattr(self.model, "explicit_conv_grads", False):  # image-sized-kernel convolutions as weight gradients
            options["post_grad_custom_post_pass"] = WeightGradientPass()
        options = {**options, **self.compile_options} or None
        if self.compile_ahead:
            return AheadCompiled(function, options, dynamic=dynamic)
        return torch.compile(function, dynamic=dynamic, options=options)

    def _check_layout(self) -> None:
        """Warn once where ``compile_channels_last`` runs on CUDA without cuDNN's benchmark, which made it slower."""
        on_cuda = any(p.is_cuda for p in self.parameters())
        if self.compile_channels_last and on_cuda and not torch.backends.cudnn.benchmark:
            rank_zero_warn(
                "model.compile_channels_last without cuDNN's benchmark is slower than neither (omniglot_20w1s on an "
                "H200: 17.01 against 14.76 ms a step, docs/PERFORMANCE.md): set trainer.benchmark=true as well"
            )
        self._layout_checked = True

    def use_capture(self, capture: Literal["cuda_graph", "compile"]) -> None:
        """Switch the inner loop and predictions to the eager functions (replayed as CUDA graphs on CUDA) or to the
        compiled ones (``UnitsMAML`` resolves ``capture="auto"`` by the length of the run; a failed compile falls
        back to "cuda_graph")."""
        if capture not in ("cuda_graph", "compile"):
            raise ValueError(f"use_capture takes 'cuda_graph' or 'compile', got {capture!r}")
        _check_compilable(capture, self.vectorize)
        self.capture = capture
        self._bind_capture()

    def __getstate__(self) -> dict[str, Any]:
        # A compiled function belongs to this instance (a deep copy would share it, and with it this instance's
        # weights and learned rates): a copy binds its own, and compiles its scoring at first use.
        state = {k: v for k, v in super().__getstate__().items() if k not in self._COMPILED_FUNCTIONS}
        if state.get("_compiled_scoring"):
            state["_compiled_scoring"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._bind_functions()

    def adapt(
        self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool
    ) -> AdaptedWeights:
        slow = inner_loop_parameters(self.model)
        if steps == 0:
            return AdaptedWeights({n: w.expand(len(support_x), *w.shape) for n, w in slow.items()}, 0)
        if self._use_graphs(support_x):
            fast = self._graphed(support_x, support_y, loss, steps, create_graph)
            return AdaptedWeights(dict(zip(slow, fast, strict=True)), steps)
        return AdaptedWeights(self._compiled_adapt(slow, support_x, support_y, loss, steps, create_graph), steps)

    def _use_graphs(self, support_x: Tensor) -> bool:
        # Under DDP too: its gradient hooks fire on the parameters' accumulators, which the replay feeds as eager
        # backward does (docs/SCALING.md has the measurements).
        if self._graphed is None or self._graphs_suspended:
            return False
        return self.training and support_x.is_cuda and torch.is_grad_enabled()

    @property
    def captures(self) -> bool:
        """Whether a caller may replay a whole step around this engine as a CUDA graph (every ``capture`` but
        "none"; "compile" puts its compiled kernels inside that graph)."""
        return self.capture != "none"

    @contextmanager
    def eager(self) -> Iterator[None]:
        """Run the inner loop eagerly inside the block: for a caller that captures a larger function around it
        (``UnitsMAML``'s whole training step), since graphs do not nest."""
        suspended, self._graphs_suspended = self._graphs_suspended, True
        try:
            yield
        finally:
            self._graphs_suspended = suspended

    def evaluate(self, support_x: Tensor, support_y: Tensor, query_x: Tensor, loss: InnerLoss, steps: int) -> Tensor:
        """Adapt to each support set (first order) and return the detached (T, Q, M, N) logits of its query sets.

        On CUDA with any ``capture`` but "none" both run as one CUDA graph per input shape (validation and test are
        otherwise bound by the host: over a thousand small kernels per batch), uncompiled under
        "compile" too when the engine is in eval mode (validation, test, predict).
        """

        def run(x: Tensor, y: Tensor, q: Tensor) -> tuple[Tensor]:
            adapted = self.adapt(x, y, loss, steps, create_graph=False)
            # Nothing flows back from these logits: predicted without recording a backward, no activations of the
            # T x Q x M query images are kept (a third of the memory of labeling_time.py on the CPU), and eagerly in
            # any mode (training's compiled scoring is for training's scores).
            with torch.no_grad():
                return (self._predict_sets(adapted.fast, q, adapted.steps),)

        if self._graphed_evaluation is not None and support_x.is_cuda and steps > 0:
            key = (support_x.shape, support_y.shape, query_x.shape, support_x.dtype, steps, id(loss), self.training)
            key += (torch.is_autocast_enabled("cuda"),)
            logits = self._graphed_evaluation(key, run, (support_x, support_y, query_x), state_of(self, loss))
            if logits is not None:
                return logits[0]
        return run(support_x, support_y, query_x)[0]

    def forward(
        self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool
    ) -> tuple[Tensor, ...]:
        """The inner loop as a plain function of the module's parameters: the tasks' fast weights as a tuple,
        in ``inner_loop_parameters`` order (what ``GraphedInnerLoop`` captures)."""
        slow = inner_loop_parameters(self.model)
        return tuple(self._adapt_all(slow, support_x, support_y, loss, steps, create_graph).values())

    def predict(self, adapted: AdaptedWeights, query_x: Tensor, task_index: Tensor) -> Tensor:
        if query_x.shape[0] == 0:
            return query_x.new_zeros(0, query_x.shape[1], self._num_outputs())
        return self._compiled_predict(adapted.fast, query_x, task_index, adapted.steps)

    def predict_sets(self, adapted: AdaptedWeights, query_x: Tensor) -> Tensor:
        if self._compiles_scoring(query_x):
            return self._score_compiled(adapted, query_x)
        return self._compiled_predict_sets(adapted.fast, query_x, adapted.steps)

    def _compiles_scoring(self, query_x: Tensor) -> bool:
        if not self.training or torch.is_grad_enabled() or self._compiled_scoring is False:
            return False
        if self.compile_scoring == "auto":  # where the inner loop compiles too: a long run, which it pays back
            return query_x.is_cuda and self.capture == "compile"
        return self.compile_scoring

    def _score_compiled(self, adapted: AdaptedWeights, query_x: Tensor) -> Tensor:
        fast = {name: w.detach() for name, w in adapted.fast.items()}
        if self._compiled_scoring is None:
            # One task at a time, its query sets vectorised: plain (not grouped) convolutions, which the
            # compiler fuses with batch norm and pooling better than the nested vmap.
            self._compiled_scoring = self._compile(self._sets_per_task, dynamic=False)
        try:
            return self._compiled_scoring(fast, query_x, adapted.steps)
        except Exception as error:  # noqa: BLE001 - any compiler failure falls back to the same eager function
            rank_zero_warn(
                f"compiling the scoring pass failed ({type(error).__name__}: {error}); it runs eagerly from now on "
                "(set model.compile_scoring=false to skip the attempt)"
            )
            self._compiled_scoring = False
            return self._predict_sets(fast, query_x, adapted.steps)

    def _adapt_all(
        self,
        slow: dict[str, Tensor],
        support_x: Tensor,
        support_y: Tensor,
        loss: InnerLoss,
        steps: int,
        create_graph: bool,
    ) -> dict[str, Tensor]:
        # Per-step tensors (learned rates, per-step batch-norm weights) split once for the whole loop, not once a step.
        rates, slices = self.inner_lr.per_step(steps), per_step_slices(self.model, steps)

        def vectorised_step(fast: dict[str, Tensor], x: Tensor, y: Tensor, step: int) -> dict[str, Tensor]:
            return self._task_step(fast, x, y, rates[step], slices[step], loss, create_graph, step)

        def eager_step(fast: dict[str, Tensor], x: Tensor, y: Tensor, step: int) -> dict[str, Tensor]:
            # Unvectorised, plain autograd computes the same as ``grad`` with less Python work per step.
            task_loss = loss(self._forward({**fast, **slices[step]}, x, step), y)
            grads = torch.autograd.grad(
                task_loss, list(fast.values()), create_graph=create_graph, allow_unused=True, materialize_grads=True
            )
            return {name: w - rates[step][name] * g for (name, w), g in zip(fast.items(), grads, strict=True)}

        def adapt_task(x: Tensor, y: Tensor, inner_step=vectorised_step) -> dict[str, Tensor]:
            fast = slow
            for step in range(steps):
                fast = inner_step(fast, x, y, step)
            return fast

        if self._vectorized(support_x):
            return vmap(adapt_task, chunk_size=self.chunk_size)(support_x, support_y)
        return _stack([adapt_task(x, y, eager_step) for x, y in zip(support_x, support_y, strict=True)])

    def _adapt_stepwise(
        self,
        slow: dict[str, Tensor],
        support_x: Tensor,
        support_y: Tensor,
        loss: InnerLoss,
        steps: int,
        create_graph: bool,
    ) -> dict[str, Tensor]:
        """``_adapt_all``'s vectorised loop with each inner step one call of ``_compiled_step`` (``compile_inner:
        step``): the slow weights are copied per task first, so that every step takes inputs of the same shapes
        and strides and the steps share one compiled graph."""
        rates, slices = self.inner_lr.per_step(steps), per_step_slices(self.model, steps)
        fast = {name: w.expand(len(support_x), *w.shape).clone() for name, w in slow.items()}
        for step in range(steps):
            number = 0 if self._steps_in_weights else step  # a Python int in a compiled call compiles per value
            fast = self._compiled_step(
                fast, support_x, support_y, rates[step], slices[step], loss, create_graph, number
            )
        return fast

    def _inner_step(
        self,
        fast: dict[str, Tensor],
        support_x: Tensor,
        support_y: Tensor,
        rates: dict[str, Tensor],
        slices: dict[str, Tensor],
        loss: InnerLoss,
        create_graph: bool,
        step: int,
    ) -> dict[str, Tensor]:
        """``_task_step`` of every task, with the tasks' fast weights (T, ...) and this step's rates and per-step
        weights."""

        def task(weights: dict[str, Tensor], x: Tensor, y: Tensor) -> dict[str, Tensor]:
            return self._task_step(weights, x, y, rates, slices, loss, create_graph, step)

        return vmap(task, chunk_size=self.chunk_size)(fast, support_x, support_y)

    def _task_step(
        self,
        weights: dict[str, Tensor],
        x: Tensor,
        y: Tensor,
        rates: dict[str, Tensor],
        slices: dict[str, Tensor],
        loss: InnerLoss,
        create_graph: bool,
        step: int,
    ) -> dict[str, Tensor]:
        """One inner step of one task (under ``vmap``), ``w - rate * grad`` with ``torch.func.grad``: the step of
        both the unrolled loop (``_adapt_all``) and the step-by-step one (``_inner_step``)."""
        grads = grad(lambda w: loss(self._forward({**w, **slices}, x, step), y))(weights)
        if not create_graph:
            grads = {name: g.detach() for name, g in grads.items()}
        return {name: w - rates[name] * grads[name] for name, w in weights.items()}

    def _predict_all(self, fast: dict[str, Tensor], query_x: Tensor, task_index: Tensor, steps: int) -> Tensor:
        if not self._vectorized(query_x):
            tasks = _unstack(fast)
            indices = task_index.tolist()
            return torch.stack([self._forward(tasks[t], x, steps) for x, t in zip(query_x, indices, strict=True)])
        weights = {name: w[task_index] for name, w in fast.items()}
        forward = lambda w, x: self._forward(w, x, steps)  # noqa: E731
        return vmap(forward, chunk_size=self.chunk_size)(weights, query_x)

    def _predict_sets(self, fast: dict[str, Tensor], query_x: Tensor, steps: int) -> Tensor:
        if self._vectorized(query_x):
            task_sets = lambda weights, sets: self._task_sets(weights, sets, steps)  # noqa: E731
            return vmap(task_sets, chunk_size=self.chunk_size)(fast, query_x)
        return self._sets_per_task(fast, query_x, steps)

    def _sets_per_task(self, fast: dict[str, Tensor], query_x: Tensor, steps: int) -> Tensor:
        return torch.stack([self._task_sets(w, sets, steps) for w, sets in zip(_unstack(fast), query_x, strict=True)])

    def _task_sets(self, weights: dict[str, Tensor], sets: Tensor, steps: int) -> Tensor:
        """One task's (S, M, ...) query sets through its weights. The sets map over the inputs only, so each
        convolution runs once on all of them instead of once per set."""
        return vmap(lambda x: self._forward(weights, x, steps))(sets)

    def _vectorized(self, x: Tensor) -> bool:
        if self.vectorize == "auto":
            return x.is_cuda or self.capture == "compile"
        return bool(self.vectorize)

    def _forward(self, fast: dict[str, Tensor], x: Tensor, step: int) -> Tensor:
        kwargs = {"step": step} if self._step_kwarg else {}
        return functional_call(self.model, fast, (x,), kwargs, strict=False)

    def _num_outputs(self) -> int:
        return list(self.model.parameters())[-1].shape[0]


def check_inductor_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` as a dict (None: empty) whose names ``torch._inductor.config`` has; else a ValueError that names
    them (Inductor itself would only refuse them at the first compiled call, after the data and the model loaded)."""
    if not options:
        return {}
    if not isinstance(options, dict) or not all(isinstance(name, str) for name in options):
        raise ValueError(f"compile_options must map Inductor option names to values, got {options!r}")
    import torch._inductor.config as inductor_config  # only where options are given: it imports the compiler

    unknown = sorted(name for name in options if not hasattr(inductor_config, name))
    if unknown:
        raise ValueError(
            f"compile_options: torch._inductor.config (torch {torch.__version__}) has no option "
            f"{', '.join(map(repr, unknown))}; see torch/_inductor/config.py for the names"
        )
    return dict(options)


def _check_compilable(capture: str, vectorize: bool | str) -> None:
    if capture == "compile" and vectorize is False:
        raise ValueError(
            "capture='compile' needs the vectorised inner loop (torch.compile cannot differentiate twice through "
            "the per-task loop's autograd.grad): set vectorize to True or 'auto', or capture to 'none'"
        )


def _unstack(fast: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """Every task's weights out of the stacked fast weights, with one ``unbind`` per tensor: its backward stacks
    the tasks' gradients once, where indexing task by task would add a zero-filled (T, ...) gradient per task."""
    columns = {name: w.unbind() for name, w in fast.items()}
    return [{name: column[t] for name, column in columns.items()} for t in range(len(next(iter(fast.values()))))]


def _stack(per_task: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Per-task weight dicts stacked along a leading task dimension."""
    return {name: torch.stack([weights[name] for weights in per_task]) for name in per_task[0]}

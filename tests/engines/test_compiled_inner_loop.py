"""``capture: compile``: the compiled inner loop's second-order meta-gradient equals eager's in float64.

The inner loop (``vmap`` over tasks of ``torch.func.grad`` steps) compiles as one graph with no graph break, the
query prediction as another, and ``torch.compile`` differentiates through both for the meta-gradient. Compiling
takes minutes (about 2 on 2 CPU cores for this tiny model, the first time; Inductor's cache serves later runs),
so the CPU case runs only with ``UNITS_LIGHTNING_COMPILE_TESTS=1``; the CUDA case runs on a GPU machine.
"""

import importlib.util
import os
import types
from pathlib import Path

import pytest
import torch

from units_lightning.compile_cache import use_compile_cache
from units_lightning.engines.base import inner_loop_parameters
from units_lightning.engines.batched import AdaptedWeights
from units_lightning.engines.build import build_engine

_spec = importlib.util.spec_from_file_location("engines_agree", Path(__file__).with_name("test_engines_agree.py"))
agree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agree)  # the float64 model, episode and tolerance of the engine-agreement tests

CPU_OPT_IN = os.environ.get("UNITS_LIGHTNING_COMPILE_TESTS") == "1"
SLOW = "compiling takes minutes: UNITS_LIGHTNING_COMPILE_TESTS=1"


def meta_gradient(engine, device, channels=2):
    support_x, support_y, query_x, query_y = (t.to(device) for t in agree.episode(channels))
    adapted = engine.adapt(support_x, support_y, agree.LOSS, agree.STEPS, create_graph=True)
    logits = engine.predict(adapted, query_x[:, 0], torch.arange(agree.TASKS, device=device))
    names, params = zip(*engine.named_parameters(), strict=True)
    return dict(zip(names, torch.autograd.grad(agree.LOSS(logits, query_y), params), strict=True))


DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not CPU_OPT_IN, reason=SLOW)),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


COMPILED_FORMS = [(2, False), (1, False), (1, True)]


# channels 1: the first layer sums shifted taps when compiled (``conv3x3``); folded: the first batch norm's statistics
# from the patches' moments (``conv3x3_batch_norm``), against the eager unfolded model
@pytest.mark.parametrize("channels,fold", COMPILED_FORMS, ids=["2ch", "1ch", "1ch-folded"])
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_inner_loop_meta_gradient_equals_eager_in_float64(device, channels, fold):
    from torch._dynamo.utils import counters

    # Vectorised over tasks, learned rates per layer and step, per-step batch norm; the same weights in both.
    eager = agree.make_engine("batched", "per_layer_per_step", True, capture="none", channels=channels).to(device)
    compiled = agree.make_engine(
        "batched", "per_layer_per_step", True, capture="compile", channels=channels, fold_first_norm=fold
    )
    compiled = compiled.to(device)
    torch._dynamo.reset()  # the counts below are of this test's compiles, whatever compiled before
    counters.clear()
    expected, ours = meta_gradient(eager, device, channels), meta_gradient(compiled, device, channels)
    agree.assert_close(ours, expected, f"compiled inner loop on {device}")
    assert counters["stats"]["unique_graphs"] == 2  # the inner loop and the query prediction, one graph each
    assert not counters["graph_break"]


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_convolutions_with_explicit_gradients_give_eagers_meta_gradient_in_float64(device, monkeypatch):
    # explicit_conv_grads under compile: Inductor's post-grad pass (conv_grads.WeightGradientPass) rewrites the double
    # backward's image-sized-kernel convolutions, one per task and layer, as one grouped weight gradient a layer
    from units_lightning import conv_grads

    passes, merged = [], []
    original, merge = conv_grads.weight_gradients_for_image_kernels, conv_grads._merge_groups
    monkeypatch.setattr(conv_grads, "weight_gradients_for_image_kernels", lambda g: passes.append(original(g)) or 0)
    monkeypatch.setattr(conv_grads, "_merge_groups", lambda g, cat: merged.append(merge(g, cat)) or merged[-1])
    eager = agree.make_engine("batched", "per_layer_per_step", True, capture="none").to(device)
    compiled = agree.make_engine("batched", "per_layer_per_step", True, capture="compile", explicit_conv_grads=True)
    torch._dynamo.reset()
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)  # a cached graph would skip the pass
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    expected, ours = meta_gradient(eager, device), meta_gradient(compiled.to(device), device)
    agree.assert_close(ours, expected, f"compiled convolutions with explicit gradients on {device}")
    assert sum(passes) >= agree.TASKS  # at least one rewritten convolution a task
    assert agree.TASKS in merged  # a layer's tasks, one convolution each, merged into one grouped weight gradient


@pytest.mark.parametrize("device", DEVICES)
def test_an_inner_loop_compiled_step_by_step_is_one_graph_with_eagers_meta_gradient_in_float64(device):
    from torch._dynamo.utils import counters

    # compile_inner="step": one compiled inner step, called for each of the STEPS steps (with that step's rates and
    # batch-norm weights as inputs), and the query prediction: two graphs, whatever the number of steps.
    eager = agree.make_engine("batched", "per_layer_per_step", True, capture="none").to(device)
    stepwise = agree.make_engine("batched", "per_layer_per_step", True, capture="compile", compile_inner="step")
    torch._dynamo.reset()  # the counts below are of this test's compiles, whatever compiled before
    counters.clear()
    expected, ours = meta_gradient(eager, device), meta_gradient(stepwise.to(device), device)
    agree.assert_close(ours, expected, f"inner loop compiled step by step on {device}")
    assert counters["stats"]["unique_graphs"] == 2  # the inner step (no recompile for the second) and the prediction
    assert not counters["graph_break"]


@pytest.mark.parametrize("second_order", [True, False], ids=["second-order", "first-order"])
def test_the_step_by_step_loop_computes_what_the_unrolled_loop_does_in_float64(second_order):
    # The loop of compile_inner="step" without the compiler (what a failed compile falls back to): the same fast
    # weights and meta-gradient as the unrolled loop, per-step rates and batch-norm weights routed by step.
    engine = agree.make_engine("batched", "per_layer_per_step", True, capture="none", compile_inner="step")
    support_x, support_y, query_x, query_y = agree.episode()
    slow = dict(inner_loop_parameters(engine.model))
    results = {}
    for name, adapt in {"unrolled": engine._adapt_all, "stepwise": engine._adapt_stepwise}.items():
        fast = adapt(slow, support_x, support_y, agree.LOSS, agree.STEPS, second_order)
        logits = engine.predict(AdaptedWeights(fast, agree.STEPS), query_x[:, 0], torch.arange(agree.TASKS))
        names, params = zip(*engine.named_parameters(), strict=True)
        grads = torch.autograd.grad(agree.LOSS(logits, query_y), params, allow_unused=True, materialize_grads=True)
        results[name] = (fast, dict(zip(names, grads, strict=True)))
    for name in results["unrolled"][0]:
        torch.testing.assert_close(results["stepwise"][0][name], results["unrolled"][0][name], rtol=1e-12, atol=1e-14)
    agree.assert_close(results["stepwise"][1], results["unrolled"][1], "step-by-step loop")


@pytest.mark.parametrize("device", DEVICES)
def test_the_channels_last_layout_compiles_eagers_meta_gradient_in_float64(device, monkeypatch):
    # compile_channels_last forces inductor's channels-last layout in every compiled graph (with cuDNN's benchmark,
    # as configs/omniglot_20w1s.yaml pairs them): a layout, not other arithmetic, so eager's meta-gradient.
    from torch._inductor.graph import GraphLowering

    forced = []
    decide = GraphLowering.decide_layout_opt

    def spy(gm, *, is_inference):
        forced.append(torch._inductor.config.force_layout_optimization)
        return decide(gm, is_inference=is_inference)

    monkeypatch.setattr(GraphLowering, "decide_layout_opt", staticmethod(spy))
    use_compile_cache()  # once per process: its caches on; then off for this test, to lower the graphs here
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    eager = agree.make_engine("batched", "per_layer_per_step", True, capture="none").to(device)
    compiled = agree.make_engine("batched", "per_layer_per_step", True, capture="compile", compile_channels_last=True)
    torch._dynamo.reset()  # compile here, not from the graphs of an earlier test in this process
    expected, ours = meta_gradient(eager, device), meta_gradient(compiled.to(device), device)
    agree.assert_close(ours, expected, f"channels-last compiled inner loop on {device}")
    assert forced and all(forced)  # every graph lowered (forward and backward) had the layout forced


def record_compile_options(monkeypatch):
    """``torch.compile`` replaced by a recorder: the returned dict fills with each compiled function's options."""
    options = {}

    def record(function, **kwargs):
        options[function.__name__] = kwargs.get("options")
        return function

    monkeypatch.setattr(torch, "compile", record)
    return options


def test_compile_channels_last_reaches_every_compiled_function_and_asks_for_cudnns_benchmark(monkeypatch):
    options = record_compile_options(monkeypatch)
    for channels_last, expected in ((True, {"force_layout_optimization": True}), (False, None)):
        options.clear()
        engine = agree.make_engine(
            "batched", "per_layer_per_step", True, capture="compile", compile_channels_last=channels_last
        )
        support_x, support_y, query_x, _ = agree.episode()
        engine.compile_scoring = True  # the scoring pass (training, no gradient) compiles at its first call
        with torch.no_grad():
            engine.predict_sets(engine.adapt(support_x, support_y, agree.LOSS, agree.STEPS, False), query_x)
        assert options == dict.fromkeys(["_adapt_all", "_predict_all", "_predict_sets", "_sets_per_task"], expected)
    # On CUDA without cuDNN's benchmark (the layout alone was slower than neither) the engine says so, once.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    engine = agree.make_engine("batched", "fixed", False, capture="compile", compile_channels_last=True)
    engine.parameters = lambda: iter([types.SimpleNamespace(is_cuda=True)])
    with pytest.warns(UserWarning, match="compile_channels_last without cuDNN's benchmark is slower"):
        engine._check_layout()
    with pytest.raises(ValueError, match="compile_channels_last must be True or False, got 'yes'"):
        agree.make_engine("batched", "fixed", False, compile_channels_last="yes")
    with pytest.raises(ValueError, match="compile_channels_last applies to the batched engine"):
        build_engine(agree.make_engine("batched", "fixed", False).model, "learn2learn", compile_channels_last=True)


def test_compile_options_reach_every_compiled_function_over_the_engines_own_and_unknown_names_are_refused(monkeypatch):
    options = record_compile_options(monkeypatch)
    engine = agree.make_engine(
        "batched",
        "per_layer_per_step",
        True,
        capture="compile",
        compile_channels_last=True,
        compile_options={"combo_kernels": True, "force_layout_optimization": False},
    )
    support_x, support_y, query_x, _ = agree.episode()
    engine.compile_scoring = True
    with torch.no_grad():
        engine.predict_sets(engine.adapt(support_x, support_y, agree.LOSS, agree.STEPS, False), query_x)
    # the user's options over the engine's own (here the layout that compile_channels_last forces)
    expected = {"force_layout_optimization": False, "combo_kernels": True}
    assert options == dict.fromkeys(["_adapt_all", "_predict_all", "_predict_sets", "_sets_per_task"], expected)
    with pytest.raises(ValueError, match=r"has no option 'combo_kernel'; see torch/_inductor/config.py"):
        agree.make_engine("batched", "fixed", False, compile_options={"combo_kernel": True})
    with pytest.raises(ValueError, match="compile_options must map Inductor option names to values"):
        agree.make_engine("batched", "fixed", False, compile_options={1: True})
    with pytest.raises(ValueError, match="compile_options applies to the batched engine"):
        build_engine(agree.make_engine("batched", "fixed", False).model, "learn2learn", compile_options={"a": 1})


def test_compile_inner_is_checked_and_belongs_to_the_batched_engine():
    with pytest.raises(ValueError, match="compile_inner must be 'loop' or 'step', got 'steps'"):
        agree.make_engine("batched", "fixed", False, compile_inner="steps")
    with pytest.raises(ValueError, match="compile_inner='step' applies to the batched engine"):
        build_engine(agree.make_engine("batched", "fixed", False).model, "learn2learn", compile_inner="step")


@pytest.mark.parametrize("device", ["cpu", DEVICES[1]])
def test_evaluation_under_compile_compiles_nothing_and_equals_eager_in_float64(device):
    from torch._dynamo.utils import counters

    # Validation and test (the engine in eval mode) run the uncompiled inner loop and predictions under
    # capture="compile" too (on CUDA inside evaluation's CUDA graphs): compiling them cost 88 s at the first
    # validation of Omniglot 20w1s on an H200 and saved 0.13 s a validation. Nothing compiles, so no opt-in on CPU.
    support_x, support_y, query_x, _ = (t.to(device) for t in agree.episode())
    logits = {}
    counters.clear()
    for capture in ("none", "compile"):
        engine = agree.make_engine("batched", "per_layer_per_step", True, capture=capture).to(device).eval()
        with torch.no_grad():  # as Lightning's validation loop runs it
            logits[capture] = engine.evaluate(support_x, support_y, query_x, agree.LOSS, agree.STEPS)
    assert counters["stats"]["unique_graphs"] == 0
    assert logits["compile"].shape == query_x.shape[:3] + (agree.WAYS,)
    relative = ((logits["compile"] - logits["none"]).norm() / logits["none"].norm()).item()
    assert relative <= 1e-10, f"evaluation under compile differs from eager by {relative:.2e}"


def test_every_capture_but_none_replays_the_whole_step_on_cuda():
    captures = {
        c: agree.make_engine("batched", "fixed", False, capture=c) for c in ("auto", "none", "cuda_graph", "compile")
    }
    assert {c: e.captures for c, e in captures.items()} == {
        "auto": True,
        "none": False,
        "cuda_graph": True,
        "compile": True,
    }
    # compile: no inner-loop graph of its own (its compiled kernels go inside the step's graph), evaluation as graphs
    assert captures["compile"]._graphed is None and captures["compile"]._graphed_evaluation is not None
    assert captures["none"]._graphed_evaluation is None


def test_compile_vectorises_the_inner_loop_on_every_device_and_refuses_the_loop():
    # The per-task loop differentiates twice through autograd.grad, which torch.compile cannot: a compiled fit on
    # CPU (where vectorize="auto" loops) failed in its first backward with "does not currently support double
    # backward". Under "compile" the inner loop is the vectorised one everywhere, and the loop is refused up front.
    cpu_batch = torch.zeros(2, 3)
    assert agree.make_engine("batched", "fixed", False, vectorize="auto", capture="compile")._vectorized(cpu_batch)
    assert not agree.make_engine("batched", "fixed", False, vectorize="auto", capture="none")._vectorized(cpu_batch)
    with pytest.raises(ValueError, match="capture='compile' needs the vectorised inner loop"):
        agree.make_engine("batched", "fixed", False, vectorize=False, capture="compile")


def test_a_copy_of_a_compiling_engine_trains_its_own_weights():
    # torch.compile wraps a bound method; deepcopy shares function objects, so a copy used to train through the
    # original's weights and learned rates (benchmarks/fit.py times a copy), and pickling it failed.
    import copy
    import pickle

    original = agree.make_engine("batched", "per_layer_per_step", True, capture="compile")
    copied = copy.deepcopy(original)
    for name in ("_compiled_adapt", "_compiled_predict", "_compiled_predict_sets"):
        assert getattr(copied, name).compiled._torchdynamo_orig_callable.__self__ is copied
        assert getattr(original, name).compiled._torchdynamo_orig_callable.__self__ is original
    loaded = pickle.loads(pickle.dumps(original))
    assert loaded._compiled_adapt.compiled._torchdynamo_orig_callable.__self__ is loaded


def test_where_compiling_fails_the_engine_warns_once_and_goes_on_as_cuda_graph(monkeypatch):
    # No Triton or C++ compiler, or an operation the compiler rejects: the first compiled call raises. The engine
    # says so once, answers that call uncompiled and switches to "cuda_graph" (the eager kernels, replayed as graphs
    # on CUDA) for good, so a long run that asked for compiling (capture "auto") still trains, at the same result.
    calls = []

    def compile_that_fails(function, **kwargs):
        def compiled(*args):
            calls.append(function.__name__)
            raise RuntimeError("no working C++ compiler")

        return compiled

    expected = meta_gradient(agree.make_engine("batched", "per_layer_per_step", True, capture="cuda_graph"), "cpu")
    monkeypatch.setattr(torch, "compile", compile_that_fails)
    engine = agree.make_engine("batched", "per_layer_per_step", True, capture="compile")
    failed = r"compiling the inner loop failed \(RuntimeError: no working C\+\+ compiler\)"
    with pytest.warns(UserWarning, match=failed):
        ours = meta_gradient(engine, "cpu")
    assert calls == ["_adapt_all"]  # the predictions that follow no longer try
    assert engine.capture == "cuda_graph" and engine._graphed is not None and engine.captures
    agree.assert_close(ours, expected, "uncompiled after a failed compile")
    meta_gradient(engine, "cpu")
    assert calls == ["_adapt_all"]  # nor does a later step


def test_use_capture_switches_between_graphs_and_compiling():
    engine = agree.make_engine("batched", "fixed", False, capture="auto")
    assert engine._compiled_adapt == engine._adapt_all and engine._graphed is not None
    evaluation = engine._graphed_evaluation
    engine.use_capture("compile")
    assert engine.capture == "compile" and engine._graphed is None
    assert engine._graphed_evaluation is not evaluation  # no replay of graphs captured from the other functions
    assert engine._compiled_adapt.compiled._torchdynamo_orig_callable == engine._adapt_all
    engine.use_capture("cuda_graph")
    assert engine._compiled_adapt == engine._adapt_all and engine._graphed is not None
    with pytest.raises(ValueError, match="use_capture takes 'cuda_graph' or 'compile', got 'none'"):
        engine.use_capture("none")
    with pytest.raises(ValueError, match="capture='compile' needs the vectorised inner loop"):
        agree.make_engine("batched", "fixed", False, vectorize=False, capture="none").use_capture("compile")

"""Both engines compute the same meta-gradients and task scores, in float64, for every option combination."""

import copy
import itertools
import warnings
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from units_lightning.backbones import ConvNet
from units_lightning.belief import task_beliefs, task_uncertainty
from units_lightning.engines import BatchedEngine, Learn2LearnEngine
from units_lightning.engines.batched import AdaptedWeights
from units_lightning.engines.cuda_graph import GraphedInnerLoop
from units_lightning.losses import EvidentialLoss

TASKS, WAYS, SHOTS, QUERY_SETS, QUERIES = 3, 3, 2, 2, 4
STEPS = 2
LOSS = partial(EvidentialLoss(), eta=0.7)


def make_engine(
    kind,
    lr_mode,
    per_step_bn,
    chunk_size=None,
    vectorize=True,
    capture="auto",
    compile_inner="loop",
    channels=2,
    compile_channels_last=False,
    compile_ahead=False,
    fold_first_norm=False,
    explicit_conv_grads=False,
    compile_options=None,
):
    torch.manual_seed(0)
    bn_steps = STEPS + 1 if per_step_bn else 1
    net = ConvNet(
        (channels, 8, 8),
        WAYS,
        filters=3,
        blocks=2,
        bn_steps=bn_steps,
        fold_first_norm=fold_first_norm,
        explicit_conv_grads=explicit_conv_grads,
    )
    net.double()
    if kind == "batched":
        engine = BatchedEngine(
            net,
            0.3,
            lr_mode,
            STEPS,
            chunk_size=chunk_size,
            capture=capture,
            vectorize=vectorize,
            compile_inner=compile_inner,
            compile_channels_last=compile_channels_last,
            compile_ahead=compile_ahead,
            compile_options=compile_options,
        )
    else:
        engine = Learn2LearnEngine(net, 0.3, lr_mode, STEPS)
    engine.double()
    with torch.no_grad():  # learned rates that differ per layer, step and entry, so routing errors show
        for rate in engine.inner_lr.parameters():
            rate.uniform_(0.1, 0.5, generator=torch.Generator().manual_seed(rate.numel()))
        for name, p in net.named_parameters():
            if name.startswith("norms."):
                p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(p.numel())))
    return engine


def episode(channels=2):
    g = torch.Generator().manual_seed(1)
    support_x = torch.randn(TASKS, WAYS * SHOTS, channels, 8, 8, generator=g, dtype=torch.float64)
    support_y = torch.arange(WAYS).repeat(SHOTS).expand(TASKS, -1)
    query_x = torch.randn(TASKS, QUERY_SETS, WAYS * QUERIES, channels, 8, 8, generator=g, dtype=torch.float64)
    query_y = torch.arange(WAYS).repeat(QUERIES).expand(TASKS, -1)
    return support_x, support_y, query_x, query_y


def meta_step(engine, second_order, channels=2):
    """Algorithm 1 in miniature: adapt, score every query set, meta-gradient of each task's first set."""
    support_x, support_y, query_x, query_y = episode(channels)
    adapted = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=second_order)
    with torch.no_grad():
        logits = engine.predict_sets(adapted, query_x)
        routed = engine.predict(adapted, query_x.flatten(0, 1), torch.arange(TASKS).repeat_interleave(QUERY_SETS))
        torch.testing.assert_close(logits.flatten(0, 1), routed, rtol=1e-12, atol=1e-14)
        beliefs = task_beliefs(EvidentialLoss().evidence(logits))
        scores = task_uncertainty(beliefs.vacuity, beliefs.dissonance, 0.6)
    logits = engine.predict(adapted, query_x[:, 0], torch.arange(TASKS))
    loss = LOSS(logits, query_y)
    names, params = zip(*engine.named_parameters(), strict=True)
    return scores, dict(zip(names, torch.autograd.grad(loss, params), strict=True))


def assert_close(ours, expected, what):
    """Relative difference at most 1e-10 per tensor, measured against the whole gradient's norm for tensors
    whose true gradient is zero (conv biases before batch norm), where a per-tensor ratio is rounding noise."""
    total = torch.cat([g.flatten() for g in expected.values()]).norm()
    for name in expected:
        a, b = ours[name], expected[name]
        relative = ((a - b).norm() / torch.maximum(b.norm(), 1e-6 * total)).item()
        assert relative <= 1e-10, f"{what}: {name} differs by {relative:.2e}"


OPTIONS = list(itertools.product([True, False], ["fixed", "per_layer_per_step", "per_parameter"], [False, True]))


@pytest.mark.parametrize(
    "second_order,lr_mode,per_step_bn",
    OPTIONS,
    ids=[f"{'2nd' if s else '1st'}-{m}-{'stepbn' if b else 'bn'}" for s, m, b in OPTIONS],
)
def test_batched_engine_matches_learn2learn(second_order, lr_mode, per_step_bn):
    scores, grads = meta_step(make_engine("batched", lr_mode, per_step_bn), second_order)
    ref_scores, ref_grads = meta_step(make_engine("learn2learn", lr_mode, per_step_bn), second_order)
    assert grads.keys() == ref_grads.keys()
    assert_close(grads, ref_grads, "meta-gradient")
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-14)
    assert all(grads[n].abs().sum() > 0 for n in grads if "convs" not in n or "bias" not in n)
    if lr_mode != "fixed":  # learned rates are meta-parameters and really get a gradient
        assert any(name.startswith("inner_lr.") and g.abs().sum() > 0 for name, g in grads.items())


@pytest.mark.parametrize("lr_mode", ["fixed", "per_layer_per_step", "per_parameter"])
def test_batched_engine_looping_over_tasks_matches_learn2learn(lr_mode):
    # The CPU default: one task at a time through the same torch.func inner loop.
    scores, grads = meta_step(make_engine("batched", lr_mode, True, vectorize=False), True)
    ref_scores, ref_grads = meta_step(make_engine("learn2learn", lr_mode, True), True)
    assert_close(grads, ref_grads, "meta-gradient")
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("second_order", [True, False], ids=["2nd", "1st"])
def test_second_order_terms_are_present(second_order):
    _, second = meta_step(make_engine("batched", "fixed", False), True)
    _, first = meta_step(make_engine("batched", "fixed", False), False)
    differs = [not torch.allclose(second[n], first[n], rtol=1e-6) for n in second]
    assert any(differs)


FOLDED = list(itertools.product(["batched", "learn2learn"], [1, 2], [True, False]))


@pytest.mark.parametrize(
    "kind,channels,per_step_bn", FOLDED, ids=[f"{k}-{c}ch-{'stepbn' if b else 'bn'}" for k, c, b in FOLDED]
)
def test_a_folded_first_batch_norm_gives_the_same_meta_gradients_and_scores(kind, channels, per_step_bn):
    # ``ConvNet(fold_first_norm=True)``: the first block's batch statistics in closed form from the patches' moments.
    # Second order, with learned per-layer rates: the statistics' second derivatives enter the meta-gradient.
    options = dict(kind=kind, lr_mode="per_layer_per_step", per_step_bn=per_step_bn, channels=channels)
    scores, grads = meta_step(make_engine(**options, fold_first_norm=True), True, channels)
    ref_scores, ref_grads = meta_step(make_engine(**options), True, channels)
    assert_close(grads, ref_grads, "folded first batch norm")
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-14)


EXPLICIT = list(itertools.product(["batched", "batched-loop", "learn2learn"], [False, True]))


@pytest.mark.parametrize("kind,fold", EXPLICIT, ids=[f"{k}{'-folded' if f else ''}" for k, f in EXPLICIT])
def test_convolutions_differentiated_through_their_own_gradients_give_the_same_meta_gradients(kind, fold):
    # ``ConvNet(explicit_conv_grads=True)``: every derivative of a convolution is its data or weight gradient
    # (``conv_grads``). Second order with learned rates and per-step batch norm, tasks under vmap (their convolutions
    # grouped), looped, and through learn2learn's autograd; scoring included.
    engine_kind, vectorize = ("batched", kind == "batched") if kind.startswith("batched") else (kind, True)
    options = dict(kind=engine_kind, lr_mode="per_layer_per_step", per_step_bn=True, vectorize=vectorize)
    options["fold_first_norm"] = fold
    scores, grads = meta_step(make_engine(**options, explicit_conv_grads=True), True)
    ref_scores, ref_grads = meta_step(make_engine(**options), True)
    assert_close(grads, ref_grads, "convolutions with explicit gradients")
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("chunk_size", [1, 2])
def test_chunked_batched_engine_equals_unchunked(chunk_size):
    scores, grads = meta_step(make_engine("batched", "per_layer_per_step", True, chunk_size=None), True)
    chunk_scores, chunk_grads = meta_step(make_engine("batched", "per_layer_per_step", True, chunk_size), True)
    assert_close(chunk_grads, grads, f"chunk_size={chunk_size}")
    torch.testing.assert_close(chunk_scores, scores, rtol=1e-12, atol=1e-14)


def test_engines_share_state_dict_layout():
    a = make_engine("batched", "per_parameter", True).state_dict()
    b = make_engine("learn2learn", "per_parameter", True).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_batched_engine_refuses_native_batch_norm():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    with pytest.raises(ValueError, match="BatchNorm2d.*wrong second-order"):
        BatchedEngine(net)


def test_graphed_inner_loop_function_equals_eager_adapt():
    # The function that GraphedInnerLoop captures (every parameter an explicit input) is the eager inner loop.
    engine = make_engine("batched", "per_layer_per_step", True)
    support_x, support_y, query_x, query_y = episode()
    names, params = zip(*engine.named_parameters(), strict=True)
    graphed = GraphedInnerLoop(engine)
    loop = lambda x, y: engine(x, y, LOSS, STEPS, True)  # noqa: E731 - what GraphedInnerLoop hands to GraphedCalls
    fast = graphed.calls.functional(names, loop, 2)(support_x, support_y, *params)
    expected = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=True).fast
    assert len(fast) == len(expected)
    for got, want in zip(fast, expected.values(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # and the meta-gradient through it reaches every parameter as through the eager loop
    eager = engine.adapt(support_x, support_y, LOSS, STEPS, True)
    functional = AdaptedWeights(dict(zip(expected, fast, strict=True)), STEPS)
    for adapted in (eager, functional):
        loss = LOSS(engine.predict(adapted, query_x[:, 0], torch.arange(TASKS)), query_y)
        grads = torch.autograd.grad(loss, params)
        if adapted is eager:
            reference = grads
    for a, b in zip(grads, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_copies_of_an_engine_do_not_share_its_graphs_or_compiled_scoring():
    engine = make_engine("batched", "fixed", False)
    engine._graphed.calls._graphs["captured"] = object()  # stands for a graph captured on the original's parameters
    engine._compiled_scoring = lambda *args: None  # and for its compiled scoring function
    twin = copy.deepcopy(engine)
    assert twin._graphed.engine is twin and twin._graphed.calls.module is twin and twin._graphed.calls._graphs == {}
    assert twin._compiled_scoring is None and engine._compiled_scoring is not None
    assert "captured" in engine._graphed.calls._graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_capture_matches_eager_on_gpu():
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    grads = {}
    for capture in ("none", "cuda_graph"):
        torch.manual_seed(0)
        net = ConvNet((2, 8, 8), WAYS, filters=3, blocks=2, bn_steps=STEPS + 1).cuda()
        engine = BatchedEngine(net, 0.3, "per_layer_per_step", STEPS, capture=capture).cuda()
        support_x, support_y, query_x, query_y = (
            t.cuda().float() if t.is_floating_point() else t.cuda() for t in episode()
        )
        # float32 with TF32 off: a tolerance for rounding, far below what a missing term would change
        for _ in range(2):  # the second call replays the captured graphs
            adapted = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=True)
            loss = LOSS(engine.predict(adapted, query_x[:, 0], torch.arange(3, device="cuda")), query_y)
            grads[capture] = torch.autograd.grad(loss, list(engine.parameters()))
    for a, b in zip(grads["cuda_graph"], grads["none"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_meta_gradient_equals_eager_in_float64_without_a_stream_mismatch():
    """Issue 13's exactness check: the replayed inner loop's meta-gradient, accumulated into ``.grad`` by
    ``backward`` as ``fit`` does, equals eager's to 1e-10 relative in float64, and no backward warns that a
    parameter's gradient accumulator sits on another stream (the capture's)."""
    grads = {}
    for capture in ("none", "cuda_graph"):
        torch.manual_seed(0)
        net = ConvNet((2, 8, 8), WAYS, filters=3, blocks=2, bn_steps=STEPS + 1)
        engine = BatchedEngine(net, 0.3, "per_layer_per_step", STEPS, capture=capture).cuda().double()
        support_x, support_y, query_x, query_y = (
            t.cuda().double() if t.is_floating_point() else t.cuda() for t in episode()
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):  # capture, then replays
                engine.zero_grad(set_to_none=True)
                adapted = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=True)
                LOSS(engine.predict(adapted, query_x[:, 0], torch.arange(3, device="cuda")), query_y).backward()
        assert not [w for w in caught if "AccumulateGrad" in str(w.message)]
        grads[capture] = torch.cat([p.grad.flatten() for p in engine.parameters() if p.grad is not None])
    error = (grads["cuda_graph"] - grads["none"]).norm() / grads["none"].norm()
    assert error < 1e-10, float(error)


def _scoring_inputs(engine):
    support_x, support_y, query_x, _ = episode()
    return engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=True), query_x


def test_compiled_scoring_is_used_for_training_scores_only(monkeypatch):
    calls = []

    def fake_compile(fn, **kwargs):  # records what would be compiled, runs it eagerly
        def compiled(*args):
            calls.append(kwargs)
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    engine = BatchedEngine(make_engine("batched", "fixed", True).model, 0.3, "fixed", STEPS, compile_scoring=True)
    engine.double().train()
    adapted, query_x = _scoring_inputs(engine)
    with torch.no_grad():
        scored = engine.predict_sets(adapted, query_x)
    assert calls == [{"dynamic": False, "options": None}]
    expected = engine._predict_sets(adapted.fast, query_x, STEPS)
    torch.testing.assert_close(scored, expected.detach(), rtol=1e-12, atol=1e-14)
    engine.predict_sets(adapted, query_x)  # with gradient: eager
    engine.eval()
    with torch.no_grad():
        engine.predict_sets(adapted, query_x)  # evaluation: eager
    assert len(calls) == 1


def test_evaluation_predicts_eagerly_without_recording_a_backward_in_any_mode(monkeypatch):
    """``evaluate`` (validation, test, select, labeling time) keeps no activations of its query images for a backward
    nothing takes, and does not compile training's scoring even in train mode (``select`` builds a model in it)."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled.append(kwargs) or fn)
    engine = BatchedEngine(make_engine("batched", "fixed", True).model, 0.3, "fixed", STEPS, compile_scoring=True)
    engine.double().train()
    support_x, support_y, query_x, _ = episode()
    grad_enabled, eager = [], engine._predict_sets
    monkeypatch.setattr(
        engine, "_predict_sets", lambda *args: grad_enabled.append(torch.is_grad_enabled()) or eager(*args)
    )
    logits = engine.evaluate(support_x, support_y, query_x, LOSS, STEPS)
    assert grad_enabled == [False] and not compiled and logits.grad_fn is None
    adapted = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=False)
    torch.testing.assert_close(logits, eager(adapted.fast, query_x, STEPS).detach(), rtol=1e-12, atol=1e-14)


def test_scoring_runs_eagerly_after_one_warning_when_compiling_fails(monkeypatch):
    def failing_compile(fn, **kwargs):
        def compiled(*args):
            raise RuntimeError("no C++ compiler")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    engine = BatchedEngine(make_engine("batched", "fixed", False).model, 0.3, "fixed", STEPS, compile_scoring=True)
    engine.double().train()
    adapted, query_x = _scoring_inputs(engine)
    with torch.no_grad(), pytest.warns(UserWarning, match="compiling the scoring pass failed.*no C\\+\\+ compiler"):
        first = engine.predict_sets(adapted, query_x)
    with torch.no_grad():
        second = engine.predict_sets(adapted, query_x)  # no second attempt, no second warning
    assert engine._compiled_scoring is False
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, engine._predict_sets(adapted.fast, query_x, STEPS).detach(), rtol=0, atol=0)


@pytest.mark.parametrize(("capture", "compiles"), [("auto", False), ("cuda_graph", False), ("compile", True)])
def test_compile_scoring_auto_compiles_on_cuda_only_where_the_inner_loop_compiles(capture, compiles):
    # A label-budget run (capture "auto" resolved to CUDA graphs) spent 14 s compiling its scoring on an H200 and
    # stepped no faster (docs/PERFORMANCE.md); a long run, resolved to "compile", compiles it.
    engine = BatchedEngine(make_engine("batched", "fixed", True).model, 0.3, "fixed", STEPS, capture=capture)
    engine.train()
    on_cuda, on_cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)  # all the rule reads of a batch
    with torch.no_grad():
        assert engine._compiles_scoring(on_cuda) is compiles
        assert engine._compiles_scoring(on_cpu) is False
    engine.compile_scoring = True
    with torch.no_grad():
        assert engine._compiles_scoring(on_cpu) is True


def test_compile_scoring_option_is_checked():
    with pytest.raises(ValueError, match="compile_scoring must be"):
        BatchedEngine(make_engine("batched", "fixed", False).model, compile_scoring="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled scoring runs on a CUDA device")
def test_compiled_scoring_matches_eager_on_gpu():
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net = ConvNet((2, 8, 8), WAYS, filters=3, blocks=2, bn_steps=STEPS + 1).cuda()
    engine = BatchedEngine(net, 0.3, "per_layer_per_step", STEPS, capture="none", compile_scoring=True)
    engine = engine.cuda().train()
    support_x, support_y, query_x, _ = (t.cuda().float() if t.is_floating_point() else t.cuda() for t in episode())
    adapted = engine.adapt(support_x, support_y, LOSS, STEPS, create_graph=True)
    with torch.no_grad():
        compiled = engine.predict_sets(adapted, query_x)
        eager = engine._predict_sets(adapted.fast, query_x, STEPS)
    assert engine._compiled_scoring not in (None, False)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)

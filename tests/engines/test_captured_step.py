"""The training step and evaluation replayed as CUDA graphs compute what the eager step computes.

On CPU: the function that is captured (every engine parameter an explicit input) equals the eager step, values and
meta-gradient. On a GPU: the replayed step's meta-gradient, accumulated by ``backward`` as ``fit`` does, equals
eager's to 1e-10 relative in float64 over several optimizer steps (capture, then replays on changed weights), with
the same choice, the same logged values and the same labels counted; evaluation likewise.
"""

import warnings

import pytest
import torch

from units_lightning.engines.cuda_graph import GraphedCalls, state_of
from units_lightning.episode import SealedLabels, TaskBatch
from units_lightning.module import UnitsMAML
from units_lightning.samplers import MultiQuerySampler, RandomSampler

TASKS, WAYS, SHOTS, QUERY_SETS, QUERIES = 3, 3, 2, 4, 2
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def make_model(capture: str, sampler, budget: int | None = None, device: str = "cpu") -> UnitsMAML:
    torch.manual_seed(0)
    model = UnitsMAML(
        n_way=WAYS,
        image_shape=(2, 16, 16),
        filters=4,
        inner_lr=0.3,
        inner_lr_mode="per_layer_per_step",
        per_step_bn=True,
        inner_steps=2,
        capture=capture,
        compile_scoring=False,
        sampler=sampler,
        label_budget=budget,
    )
    return model.to(device).double()


def batch(seed: int = 1, device: str = "cpu", query_sets: int = QUERY_SETS) -> TaskBatch:
    g = torch.Generator().manual_seed(seed)
    support_x = torch.randn(TASKS, WAYS * SHOTS, 2, 16, 16, generator=g, dtype=torch.float64)
    support_y = torch.arange(WAYS).repeat(SHOTS).expand(TASKS, -1).contiguous()
    query_x = torch.randn(TASKS, query_sets, WAYS * QUERIES, 2, 16, 16, generator=g, dtype=torch.float64)
    query_y = torch.stack([torch.randperm(WAYS * QUERIES, generator=g) % WAYS for _ in range(TASKS * query_sets)])
    labels = SealedLabels(query_y.view(TASKS, query_sets, -1).to(device))
    classes = torch.zeros(TASKS, WAYS, dtype=torch.long)
    return TaskBatch(support_x.to(device), support_y.to(device), query_x.to(device), labels, classes)


def test_the_captured_function_is_the_eager_step_on_cpu():
    model = make_model("none", MultiQuerySampler(tasks=TASKS, query_sets=QUERY_SETS))
    episode, lam, eta = batch(), 0.7, 0.4
    model.inner_loss.set_eta(eta)
    eager = model._forward_pass(episode, lam, eta, True, TASKS)
    names, params = zip(*model.engine.named_parameters(), strict=True)
    forward, value_names = model.captured_step.function(model._forward_pass, episode.classes, True, TASKS)
    scalars = torch.tensor([lam, eta], dtype=torch.float64)
    inputs = (episode.support_x, episode.support_y, episode.query_x, episode.query_y._labels, scalars)
    loss, scores, chosen, labels, *rest = GraphedCalls(model.engine).functional(names, forward, 5)(*inputs, *params)
    assert value_names == list(eager.values)
    torch.testing.assert_close(scores, eager.scores, rtol=1e-12, atol=0)
    assert torch.equal(chosen, eager.chosen) and torch.equal(labels, eager.labels)
    for got, want in zip(rest[5:], eager.values.values(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    expected = torch.autograd.grad(eager.loss, params)
    for got, want in zip(torch.autograd.grad(loss, params), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    assert model.ledger.query_sets == TASKS  # the eager step counted; the function opens labels without counting


def _train(model: UnitsMAML, steps: int, device: str, warned: list | None = None) -> list[dict]:
    optimizer = model.configure_optimizers()
    seen, warned = [], [] if warned is None else warned
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            episode = batch(seed=step % 2 + 1, device=device, query_sets=model.sampler.query_sets)
            output = model.training_step(episode, step)
            output["loss"].backward()
        warned.extend((step, str(w.message)[:90]) for w in caught if "AccumulateGrad" in str(w.message))
        warned.extend((step, str(w.message)[:200]) for w in caught if "capturing" in str(w.message))
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        seen.append({**output, "grad": grad, "values": dict(model.train_means.compute())})
        optimizer.step()
    return seen


@CUDA
@pytest.mark.parametrize("captured", ["cuda_graph", "compile"])  # compile: compiled kernels inside the graph
@pytest.mark.parametrize("sampler", ["scored", "warm-up", "random"])
def test_the_replayed_step_equals_eager_in_float64(sampler, captured):
    make = {
        "scored": lambda: MultiQuerySampler(tasks=TASKS, query_sets=QUERY_SETS),
        "warm-up": lambda: MultiQuerySampler(tasks=TASKS, query_sets=QUERY_SETS, warmup_steps=10),
        "random": lambda: RandomSampler(tasks=TASKS),
    }[sampler]
    runs, models = {}, {}
    for capture in ("none", captured):
        models[capture] = make_model(capture, make(), device="cuda")
        warned: list = []  # (step, message): a stream mismatch, or a capture that failed
        runs[capture] = _train(models[capture], 4, "cuda", warned)  # capture, then replays on new weights and batches
        assert not warned, (capture, warned)
    graphs = models[captured].captured_step.graphs
    assert graphs and len(graphs._graphs) == 1
    for eager, replayed in zip(runs["none"], runs[captured], strict=True):
        error = (replayed["grad"] - eager["grad"]).norm() / eager["grad"].norm()
        assert error < 1e-10, float(error)
        assert torch.equal(replayed["chosen"], eager["chosen"])
        torch.testing.assert_close(replayed["scores"], eager["scores"], rtol=1e-10, atol=0)
        torch.testing.assert_close(replayed["vacuity"], eager["vacuity"], rtol=1e-10, atol=0)
        assert replayed["values"].keys() == eager["values"].keys()
        for name, value in eager["values"].items():
            torch.testing.assert_close(replayed["values"][name], value, rtol=1e-10, atol=1e-14)
    assert models[captured].ledger.state_dict() == models["none"].ledger.state_dict()
    models[captured].ledger.check_count(models[captured].sampler)  # the declared count held on the device


@CUDA
def test_the_last_step_of_a_budget_runs_eagerly_and_spends_it_exactly():
    budget = 2 * TASKS + 1  # the third step may label one set only
    ledgers = {}
    for capture in ("none", "cuda_graph"):
        model = make_model(capture, MultiQuerySampler(tasks=TASKS, query_sets=QUERY_SETS), budget, "cuda")
        model.ledger.start(TASKS)
        runs = _train(model, 3, "cuda")
        assert runs[-1]["chosen"].sum() == 1 and model.ledger.exhausted
        ledgers[capture] = model.ledger.state_dict()
    assert ledgers["cuda_graph"] == ledgers["none"] and ledgers["none"]["query_sets"] == budget


@CUDA
@pytest.mark.parametrize("captured", ["cuda_graph", "compile"])
def test_replayed_evaluation_equals_eager_and_reads_the_current_weights(captured):
    results = {}
    for capture in ("none", captured):
        model = make_model(capture, RandomSampler(tasks=TASKS), device="cuda").eval()
        episode = batch(device="cuda")
        sets = [episode.query_x[:, 0], episode.query_x[:, 1]]
        first = model.adapt_and_predict_sets(episode.support_x, episode.support_y, sets)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9)  # the replay must see these, not the weights of the capture
        second = model.adapt_and_predict_sets(episode.support_x, episode.support_y, sets)
        results[capture] = first + second
        graphs = model.engine._graphed_evaluation
        assert (graphs is None) == (capture == "none") and (graphs is None or (graphs._graphs and not graphs.failed))
    for got, want in zip(results[captured], results["none"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    assert not torch.equal(results["none"][0], results["none"][2])


def _to_the_cpu_and_back(model: UnitsMAML) -> list:
    """``model.cpu()`` then ``model.cuda()``, as Lightning does between ``fit`` and ``test``, with the memory the model
    left filled with NaN in between: tensors of its tensors' sizes take their freed blocks back (the caching allocator
    hands a freed block to the next request of its size), and one more takes what else is cached. A graph that still
    read the old addresses gives NaN (or faults) instead of the old values by luck. Returns the fillers: keep them
    alive until the comparison."""
    shapes = [(t.shape, t.dtype) for t in state_of(model)]
    model.cpu()
    fillers = [
        torch.full(shape, float("nan") if dtype.is_floating_point else -1, dtype=dtype, device="cuda")
        for shape, dtype in shapes
    ]
    free = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    fillers.append(torch.full((max(free // 8, 1),), float("nan"), dtype=torch.float64, device="cuda"))
    model.cuda()
    return fillers


@CUDA
def test_evaluation_after_the_model_went_to_the_cpu_and_back_reads_its_new_weights():
    # Lightning moves the model to the CPU when fit, validate or test ends, and back for the next one: graphs
    # captured before must not be replayed (they read the old storage by address).
    results = {}
    for capture in ("none", "cuda_graph"):
        model = make_model(capture, RandomSampler(tasks=TASKS), device="cuda").eval()
        episode = batch(device="cuda")
        sets = [episode.query_x[:, 0], episode.query_x[:, 1]]
        first = model.adapt_and_predict_sets(episode.support_x, episode.support_y, sets)
        fillers = _to_the_cpu_and_back(model)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9)
        second = model.adapt_and_predict_sets(episode.support_x, episode.support_y, sets)
        del fillers
        results[capture] = first + second
    for got, want in zip(results["cuda_graph"], results["none"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    assert len(model.engine._graphed_evaluation._graphs) == 1  # the stale graph was dropped, not kept beside


@CUDA
@pytest.mark.parametrize("captured", ["cuda_graph", "compile"])
def test_training_after_the_model_went_to_the_cpu_and_back_equals_eager(captured):
    # A second fit in one process (a notebook): the captured steps read the inner loss's eta by address.
    runs = {}
    for capture in ("none", captured):
        model = make_model(capture, MultiQuerySampler(tasks=TASKS, query_sets=QUERY_SETS), device="cuda")
        runs[capture] = _train(model, 2, "cuda")
        fillers = _to_the_cpu_and_back(model)
        runs[capture] += _train(model, 2, "cuda")
        del fillers
    for eager, replayed in zip(runs["none"], runs[captured], strict=True):
        error = (replayed["grad"] - eager["grad"]).norm() / eager["grad"].norm()
        assert error < 1e-10, float(error)

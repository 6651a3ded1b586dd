"""A captured graph reads tensors by address: once they move (Lightning moves the model to the CPU after each fit,
validate or test, and back for the next), its key is captured anew instead of replayed over freed memory. The
bookkeeping runs on any device; the replays themselves are checked on a GPU in test_captured_step.py."""

from types import SimpleNamespace

import torch
from torch import nn

from units_lightning.engines.cuda_graph import GraphedCalls, GraphedInference, addresses, state_of
from units_lightning.losses import EvidentialLoss, ScheduledInnerLoss


def test_state_of_lists_the_parameters_and_buffers_of_modules_only():
    linear, loss = nn.Linear(2, 3), ScheduledInnerLoss(EvidentialLoss())
    assert [t.shape for t in state_of(linear, loss, object())] == [(3, 2), (3,), ()]


def test_addresses_change_when_a_module_gets_new_storage():
    linear = nn.Linear(2, 3)
    before = addresses(state_of(linear))
    assert addresses(state_of(linear)) == before
    linear.double()  # new storage, as a move to another device and back
    assert addresses(state_of(linear)) != before


def _fake_inference_capture(graphs: GraphedInference, captured: list):
    def capture(key, fn, inputs, where):
        captured.append(key)
        static = [x.clone() for x in inputs]
        graphs._graphs[key] = (SimpleNamespace(replay=lambda: None), static, fn(*static), where)
        return graphs._graphs[key]

    return capture


def test_evaluation_is_captured_anew_after_its_weights_moved_and_the_stale_graph_is_dropped(monkeypatch):
    linear, graphs, captured = nn.Linear(2, 2), GraphedInference(max_graphs=1), []
    monkeypatch.setattr(graphs, "_capture", _fake_inference_capture(graphs, captured))
    x = torch.ones(1, 2)
    fn = lambda x: (linear(x),)  # noqa: E731
    for _ in range(2):
        assert graphs("k", fn, (x,), state_of(linear)) is not None
    assert captured == ["k"]
    linear.double()
    out = graphs("k", fn, (x.double(),), state_of(linear))
    assert captured == ["k", "k"] and out is not None and len(graphs._graphs) == 1  # in its place: max_graphs=1 holds


def test_training_graphs_are_captured_anew_after_the_module_or_the_loss_moved(monkeypatch):
    made = []

    def fake_make_graphed_callables(fn, sample_args, allow_unused_input):
        made.append(len(sample_args))
        return fn

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_make_graphed_callables)
    linear, loss = nn.Linear(2, 2), ScheduledInnerLoss(EvidentialLoss())
    calls = GraphedCalls(linear, max_graphs=1)
    x = torch.ones(1, 2)
    fn = lambda x: (linear(x).sum() * loss.eta,)  # noqa: E731
    calls("k", fn, (x,), state_of(loss))
    calls("k", fn, (x,), state_of(loss))
    assert len(made) == 1
    loss.double()  # the loss's eta buffer moved
    calls("k", fn, (x,), state_of(loss))
    linear.double()  # the module's parameters moved
    out = calls("k", fn, (x.double(),), state_of(loss))
    assert len(made) == 3 and len(calls._graphs) == 1 and out[0].dtype == torch.float64

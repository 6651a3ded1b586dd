"""The learn2learn engine against MAML written out by hand with torch.func, in float64."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

from units_lightning.engines import Learn2LearnEngine
from units_lightning.losses import EvidentialLoss


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def reference_meta_gradient(net, support_x, support_y, query_x, query_y, loss, steps, lr, second_order):
    params = {name: p.detach().clone().requires_grad_(True) for name, p in net.named_parameters()}

    def inner_loss(weights, x, y):
        return loss(functional_call(net, weights, (x,)), y)

    total = 0.0
    for sx, sy, qx, qy in zip(support_x, support_y, query_x, query_y, strict=True):
        fast = dict(params)
        for _ in range(steps):
            grads = torch.autograd.grad(inner_loss(fast, sx, sy), list(fast.values()), create_graph=second_order)
            fast = {name: w - lr * g for (name, w), g in zip(fast.items(), grads, strict=True)}
        total = total + inner_loss(fast, qx, qy)
    return torch.autograd.grad(total / len(support_x), list(params.values()))


@pytest.mark.parametrize("second_order", [True, False], ids=["second-order", "first-order"])
def test_meta_gradient_matches_hand_written_maml(second_order):
    torch.manual_seed(1)
    support_x, support_y = torch.randn(3, 6, 12, dtype=torch.float64), torch.randint(0, 3, (3, 6))
    query_x, query_y = torch.randn(3, 9, 12, dtype=torch.float64), torch.randint(0, 3, (3, 9))
    loss = EvidentialLoss()
    inner = lambda logits, labels: loss(logits, labels, eta=0.5)  # noqa: E731
    net = tiny_net()
    engine = Learn2LearnEngine(net, inner_lr=0.3)
    adapted = engine.adapt(support_x, support_y, inner, steps=2, create_graph=second_order)
    logits = engine.predict(adapted, query_x, torch.arange(3))
    meta_loss = torch.stack([inner(logits[t], query_y[t]) for t in range(3)]).mean()
    ours = torch.autograd.grad(meta_loss, list(engine.parameters()))
    expected = reference_meta_gradient(net, support_x, support_y, query_x, query_y, inner, 2, 0.3, second_order)
    for a, b in zip(ours, expected, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    if second_order:  # and the second-order terms are really there
        first = reference_meta_gradient(net, support_x, support_y, query_x, query_y, inner, 2, 0.3, False)
        assert any(not torch.allclose(a, b, rtol=1e-6) for a, b in zip(ours, first, strict=True))


def test_predict_routes_each_query_set_to_its_task():
    engine = Learn2LearnEngine(tiny_net(), inner_lr=0.3)
    support_x, support_y = torch.randn(2, 6, 12, dtype=torch.float64), torch.randint(0, 3, (2, 6))
    adapted = engine.adapt(support_x, support_y, EvidentialLoss(), steps=1, create_graph=False)
    query = torch.randn(3, 4, 12, dtype=torch.float64)
    routed = engine.predict(adapted, query, torch.tensor([1, 0, 1]))
    assert torch.allclose(routed[0], adapted[1](query[0]))
    assert torch.allclose(routed[1], adapted[0](query[1]))
    assert engine.predict(adapted, query[:0], torch.tensor([], dtype=torch.long)).shape == (0, 4, 3)


def test_adaptation_leaves_the_meta_parameters_untouched():
    net = tiny_net()
    before = [p.detach().clone() for p in net.parameters()]
    engine = Learn2LearnEngine(net, inner_lr=0.3)
    engine.adapt(torch.randn(2, 6, 12, dtype=torch.float64), torch.randint(0, 3, (2, 6)), EvidentialLoss(), 3, True)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))

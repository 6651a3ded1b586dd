"""Per-step tensors (learned inner rates, per-step batch-norm weights) are split once per inner loop."""

import torch

from units_lightning.backbones import ConvNet
from units_lightning.engines import BatchedEngine, InnerLearningRates
from units_lightning.engines.base import per_step_slices
from units_lightning.losses import EvidentialLoss

STEPS, WAYS = 3, 3


def _engine(vectorize: bool) -> BatchedEngine:
    torch.manual_seed(0)
    net = ConvNet((1, 8, 8), WAYS, filters=2, blocks=2, bn_steps=STEPS + 1).double()
    return BatchedEngine(net, 0.3, "per_layer_per_step", STEPS, capture="none", vectorize=vectorize).double()


def _backward_nodes(outputs: list[torch.Tensor]) -> list[str]:
    seen, names, stack = set(), [], [t.grad_fn for t in outputs]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(parent for parent, _ in node.next_functions)
    return names


def test_slices_and_rates_equal_what_each_step_selects():
    engine = _engine(vectorize=True)
    with torch.no_grad():
        for p in engine.parameters():
            p.add_(torch.randn(p.shape, dtype=p.dtype))
    steps = STEPS + 2  # evaluation may take more steps than training: they reuse the last slice
    slices, rates = per_step_slices(engine.model, steps), engine.inner_lr.per_step(steps)
    weights = dict(engine.model.named_parameters())
    assert set(slices[0]) == engine.model.per_step_parameters and len(slices) == len(rates) == steps
    for step in range(steps):
        for name, part in slices[step].items():
            torch.testing.assert_close(part, weights[name][min(step, STEPS)], rtol=0, atol=0)
        for name in engine.inner_lr.names:
            torch.testing.assert_close(rates[step][name], engine.inner_lr(name, step), rtol=0, atol=0)


def test_fixed_and_per_parameter_rates_per_step_are_the_rates_themselves():
    weights = {"w": torch.zeros(2, 3)}
    assert InnerLearningRates(weights, 0.2, "fixed", 2).per_step(3) == [{"w": 0.2}] * 3
    per_parameter = InnerLearningRates(weights, 0.2, "per_parameter", 2)
    assert all(rates["w"] is per_parameter.rates["w"] for rates in per_parameter.per_step(3))


def test_the_inner_loop_reaches_each_per_step_tensor_through_one_node():
    # Indexing a stacked tensor once per step gave one SelectBackward node per step and tensor (a zero-filled tensor,
    # a copy and an addition in the meta-gradient each); split once, each tensor has one UnbindBackward node.
    for vectorize in (True, False):
        engine = _engine(vectorize)
        support_x = torch.randn(2, WAYS, 1, 8, 8, dtype=torch.float64)
        support_y = torch.arange(WAYS).repeat(2, 1)
        loss = lambda logits, y: EvidentialLoss()(logits, y, eta=0.5)  # noqa: E731
        adapted = engine.adapt(support_x, support_y, loss, STEPS, create_graph=True)
        nodes = _backward_nodes(list(adapted.fast.values()))
        stacked = len(engine.model.per_step_parameters) + len(engine.inner_lr.names)
        assert nodes.count("SelectBackward0") == 0, vectorize
        assert nodes.count("UnbindBackward0") == stacked, vectorize

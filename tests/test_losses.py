import math

import pytest
import torch

from units_lightning.belief import belief, incorrect_belief
from units_lightning.losses import CrossEntropyLoss, EvidentialLoss


def test_marginal_likelihood_matches_the_closed_form():
    logits = torch.tensor([[0.3, -1.2, 2.0]], dtype=torch.float64)
    alpha = torch.nn.functional.softplus(logits) + 1
    expected = math.log(alpha.sum()) - math.log(alpha[0, 2])
    assert EvidentialLoss()(logits, torch.tensor([2])).item() == pytest.approx(expected)


@pytest.mark.parametrize("reduction,divisor", [("sum", 1), ("mean", 3)], ids=["paper-sum", "code-mean"])
def test_incorrect_belief_regulariser_reduction_is_explicit(reduction, divisor):
    logits = torch.tensor([[1.0, 2.0, -0.5], [0.1, 0.2, 0.3]], dtype=torch.float64)
    labels = torch.tensor([0, 2])
    loss = EvidentialLoss(ib_reduction=reduction)
    regulariser = incorrect_belief(belief(torch.nn.functional.softplus(logits)), labels).mean() / divisor
    assert (loss(logits, labels, eta=2.0) - loss(logits, labels, eta=0.0)).item() == pytest.approx(
        2 * regulariser.item()
    )


@pytest.mark.parametrize(
    "loss",
    [
        EvidentialLoss(),
        EvidentialLoss(ib_reduction="mean"),
        EvidentialLoss(activation="exp"),
        EvidentialLoss(activation="relu"),
        CrossEntropyLoss(),
    ],
    ids=["softplus-sum", "softplus-mean", "exp", "relu", "cross-entropy"],
)
@pytest.mark.parametrize("magnitude", [50.0, -50.0, 1e4], ids=["+50", "-50", "1e4"])
def test_loss_and_gradients_are_finite_at_extreme_logits(loss, magnitude):
    logits = torch.full((6, 5), magnitude)
    logits[::2, 0] = -magnitude
    logits.requires_grad_(True)
    value = loss(logits, torch.arange(6) % 5, eta=8.0)
    value.backward()
    assert torch.isfinite(value)
    assert torch.isfinite(logits.grad).all()
    assert torch.isfinite(loss.evidence(logits)).all()


def test_confident_correct_predictions_cost_less_than_confident_wrong_ones():
    loss = EvidentialLoss()
    right = torch.tensor([[20.0, -20.0]])
    assert loss(right, torch.tensor([0]), eta=1.0) < loss(right, torch.tensor([1]), eta=1.0)


def test_cross_entropy_is_plain_softmax_cross_entropy_and_ignores_eta():
    logits, labels = torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3))
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1))
    assert torch.allclose(CrossEntropyLoss()(logits, labels, eta=3.0), expected)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="ib_reduction"):
        EvidentialLoss(ib_reduction="max")
    with pytest.raises(ValueError, match="activation"):
        EvidentialLoss(activation="tanh")

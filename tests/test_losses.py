import math

import pytest
import torch

from units_lightning.belief import belief, incorrect_belief
from units_lightning.losses import (
    EXP_EVIDENCE_MAX_LOGIT,
    CrossEntropyLoss,
    EvidentialLoss,
    MetaLoss,
    class_balanced_copy,
    class_balanced_mean,
)


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
        EvidentialLoss(activation="relu", vacuity_weight=1.0),
        EvidentialLoss(activation="exp", vacuity_weight=1.0),
        CrossEntropyLoss(),
    ],
    ids=["softplus-sum", "softplus-mean", "exp", "relu", "relu-vacuity", "exp-vacuity", "cross-entropy"],
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


def loss_before_the_options(logits, labels, eta, reduction="sum", activation="softplus"):
    """The evidential loss as it was written before the vacuity regulariser (commit 4e55e7c), op for op."""
    if activation == "softplus":
        evidence = torch.nn.functional.softplus(logits)
    elif activation == "relu":
        evidence = torch.nn.functional.relu(logits)
    else:
        evidence = torch.exp(logits.clamp(max=60.0))
    labels = labels.long()
    strength = evidence.sum(dim=-1) + evidence.shape[-1]
    nll = torch.log(strength) - torch.log1p(evidence.gather(-1, labels.unsqueeze(-1)).squeeze(-1))
    loss = nll.mean()
    if isinstance(eta, torch.Tensor) or eta != 0:
        regulariser = incorrect_belief(belief(evidence), labels)
        if reduction == "mean":
            regulariser = regulariser / evidence.shape[-1]
        loss = loss + eta * regulariser.mean()
    return loss


@pytest.mark.parametrize("eta", [0.0, 2.0, torch.tensor(8.0)], ids=["eta0", "eta2", "tensor-eta8"])
@pytest.mark.parametrize(
    "options",
    [{}, {"ib_reduction": "mean"}, {"activation": "relu"}, {"activation": "exp"}, {"vacuity_weight": 0.0}],
    ids=["defaults", "mean", "relu", "exp", "regulariser-off"],
)
def test_the_loss_and_its_gradients_are_bit_for_bit_those_before_the_vacuity_regulariser(options, eta):
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(4, 6, 5, generator=generator)).requires_grad_(True)
    labels = torch.randint(0, 5, (4, 6), generator=generator)
    reduction, activation = options.get("ib_reduction", "sum"), options.get("activation", "softplus")
    expected = loss_before_the_options(logits, labels, eta, reduction, activation)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    value = EvidentialLoss(**options)(logits, labels, eta)
    (grad,) = torch.autograd.grad(value, logits)
    assert torch.equal(value, expected)
    assert torch.equal(grad, expected_grad)


def test_vacuity_regulariser_gives_gradient_at_zero_relu_evidence_where_the_papers_loss_gives_none():
    logits = torch.tensor([[-2.0, -0.5, -3.0], [-1.0, -4.0, -0.1]], requires_grad=True)  # no evidence anywhere
    labels = torch.tensor([2, 0])
    (paper,) = torch.autograd.grad(EvidentialLoss(activation="relu")(logits, labels, eta=2.0), logits)
    assert torch.equal(paper, torch.zeros_like(logits))  # the freeze: nothing moves
    regularised = EvidentialLoss(activation="relu", vacuity_weight=0.5)
    (grad,) = torch.autograd.grad(regularised(logits, labels, eta=2.0), logits)
    # vacuity 1 on both samples: d(-0.5 * mean(u * o_y)) / d o_y = -0.5 / 2 on each true class, 0 elsewhere
    expected = torch.zeros_like(logits)
    expected[0, 2] = expected[1, 0] = -0.25
    assert torch.equal(grad, expected)


@pytest.mark.parametrize("activation", ["softplus", "relu", "exp"])
def test_vacuity_regulariser_is_minus_vacuity_times_the_true_logit_with_vacuity_held_constant(activation):
    logits = torch.tensor([[0.3, -1.2, 2.0], [1.5, 0.5, -0.7]], dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([2, 1])
    loss = EvidentialLoss(activation=activation, vacuity_weight=3.0)
    evidence = loss.evidence(logits.detach())
    u = 3 / (evidence.sum(-1) + 3)
    added = loss(logits, labels, eta=1.0) - EvidentialLoss(activation=activation)(logits, labels, eta=1.0)
    assert added.item() == pytest.approx(-3.0 * (u * logits.detach()[[0, 1], [2, 1]]).mean().item())
    (grad,) = torch.autograd.grad(added, logits)
    expected = torch.zeros_like(logits)
    expected[0, 2], expected[1, 1] = -3.0 * u[0] / 2, -3.0 * u[1] / 2  # no gradient through the vacuity
    assert torch.allclose(grad, expected)


@pytest.mark.parametrize(
    "activation,evidence,slope",
    [
        ("softplus", lambda x: torch.log1p(torch.exp(x)), lambda x: torch.sigmoid(x)),
        ("relu", lambda x: x.clamp(min=0), lambda x: (x > 0).double()),
        ("exp", torch.exp, torch.exp),
    ],
    ids=["softplus", "relu", "exp"],
)
def test_each_evidence_activation_has_its_values_and_gradients(activation, evidence, slope):
    logits = torch.tensor([-3.0, -0.5, 0.25, 2.0, 7.0], dtype=torch.float64, requires_grad=True)
    values = EvidentialLoss(activation=activation).evidence(logits)
    assert torch.allclose(values, evidence(logits.detach()))
    (grad,) = torch.autograd.grad(values.sum(), logits)
    assert torch.allclose(grad, slope(logits.detach()))


def test_relu_evidence_has_no_gradient_below_zero_and_softplus_and_exp_keep_one():
    logits = torch.tensor([-6.0], requires_grad=True)
    slopes = {}
    for activation in ("relu", "softplus", "exp"):
        (slopes[activation],) = torch.autograd.grad(EvidentialLoss(activation=activation).evidence(logits), logits)
    assert slopes["relu"].item() == 0.0
    assert 0.0 < slopes["softplus"].item() < 0.01 and 0.0 < slopes["exp"].item() < 0.01


def test_exp_evidence_is_clamped_finite_at_large_logits():
    logits = torch.tensor([[1e4, 100.0, 0.0]], requires_grad=True)
    loss = EvidentialLoss(activation="exp", vacuity_weight=1.0)
    assert loss.evidence(logits)[0, 0] == loss.evidence(logits)[0, 1] == math.exp(EXP_EVIDENCE_MAX_LOGIT)
    value = loss(logits, torch.tensor([2]), eta=8.0)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(logits.grad).all()
    for dtype in (torch.float16, torch.bfloat16):  # exp(60) does not fit float16: its evidence is inf, not NaN
        assert not loss.evidence(logits.detach().to(dtype)).isnan().any()


@pytest.mark.parametrize("n_way", [2, 5, 20])
def test_eta_in_mean_units_equals_eta_times_classes_in_sum_units(n_way):
    generator = torch.Generator().manual_seed(n_way)
    logits = 2 * torch.randn(3, 7, n_way, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, n_way, (3, 7), generator=generator)
    eta_sum = 0.3
    summed = EvidentialLoss(ib_reduction="sum")(logits, labels, eta=eta_sum)
    averaged = EvidentialLoss(ib_reduction="mean")(logits, labels, eta=eta_sum * n_way)
    assert averaged.item() == pytest.approx(summed.item(), rel=1e-12)
    assert EvidentialLoss(ib_reduction="mean")(logits, labels, eta=eta_sum).item() < summed.item()


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
def test_a_vacuity_weight_that_is_not_a_finite_non_negative_number_is_rejected(weight):
    with pytest.raises(ValueError, match="vacuity_weight must be a finite weight >= 0"):
        EvidentialLoss(vacuity_weight=weight)


@pytest.mark.parametrize(
    "loss",
    [EvidentialLoss(vacuity_weight=0.5), EvidentialLoss(ib_reduction="mean", activation="exp"), CrossEntropyLoss()],
    ids=["evidential", "evidential-mean-exp", "cross-entropy"],
)
def test_class_balanced_equals_the_plain_mean_on_episodes_with_as_many_samples_of_every_class(loss):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    labels = torch.arange(5).repeat(2).expand(3, 10)  # two of each class in every task
    plain = loss(logits, labels, 2.0)
    (plain_grad,) = torch.autograd.grad(plain, logits)
    loss.class_balanced = True
    balanced = loss(logits, labels, 2.0)
    (balanced_grad,) = torch.autograd.grad(balanced, logits)
    assert torch.allclose(plain, balanced, rtol=0, atol=1e-12)
    assert torch.allclose(plain_grad, balanced_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("loss", [EvidentialLoss(ib_reduction="mean", vacuity_weight=0.5), CrossEntropyLoss()])
def test_a_class_balanced_copy_balances_with_the_loss_s_other_options_and_leaves_the_loss_as_it_was(loss):
    logits = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([[0, 0, 0, 1], [2, 1, 2, 2]])
    before = loss(logits, labels, 2.0)
    balanced = class_balanced_copy(loss)
    assert balanced is not loss and balanced.class_balanced and not loss.class_balanced
    assert vars(balanced) == {**vars(loss), "class_balanced": True}  # every other option kept
    assert float(balanced(logits, labels, 2.0)) != pytest.approx(float(before))
    assert float(loss(logits, labels, 2.0)) == float(before)
    assert class_balanced_copy(balanced) is balanced  # already balanced: itself


def test_a_class_balanced_copy_of_a_loss_without_the_option_is_the_loss():
    class Custom(MetaLoss):
        pass

    custom = Custom()
    assert class_balanced_copy(custom) is custom


def test_class_balanced_mean_gives_every_class_present_the_same_weight_per_task():
    values = torch.tensor([[1.0, 1.0, 1.0, 4.0], [2.0, 6.0, 6.0, 6.0]])
    labels = torch.tensor([[0, 0, 0, 2], [1, 0, 0, 0]])  # classes 0 and 2, then 1 and 0; class 1 / 2 absent
    # task 1: (1 + 4) / 2; task 2: (2 + 6) / 2; then the mean over tasks
    assert float(class_balanced_mean(values, labels, 3)) == pytest.approx((2.5 + 4.0) / 2)
    assert float(class_balanced_mean(values[0], labels[0], 3)) == pytest.approx(2.5)  # one task, no task dimension


@pytest.mark.parametrize("loss", [EvidentialLoss(class_balanced=True), CrossEntropyLoss(class_balanced=True)])
def test_a_class_balanced_loss_is_the_mean_of_its_per_class_losses_and_vectorises_over_tasks(loss):
    """An unbalanced support (a class with 3 labeled images, one with 1): each class's mean loss weighs half."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 3, generator=generator)
    labels = torch.tensor([[0, 0, 0, 1], [2, 1, 2, 2]])
    plain = type(loss)()
    for t in range(2):
        by_class = [plain(logits[t, labels[t] == c], labels[t, labels[t] == c]) for c in labels[t].unique()]
        assert float(loss(logits[t], labels[t])) == pytest.approx(float(torch.stack(by_class).mean()), abs=1e-6)
    per_task = torch.func.vmap(lambda x, y: loss(x, y))(logits, labels)  # the batched engine's inner loop
    assert torch.allclose(per_task, torch.stack([loss(logits[t], labels[t]) for t in range(2)]))
    assert float(loss(logits, labels)) == pytest.approx(float(per_task.mean()), abs=1e-6)

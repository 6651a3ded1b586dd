import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from units_lightning.belief import (
    belief,
    correct_belief,
    dissonance,
    expected_probability,
    incorrect_belief,
    task_beliefs,
    task_uncertainty,
    vacuity,
)


def literal_dissonance(b: list[float]) -> float:
    """The paper's dissonance written as the double sum, one term at a time."""
    total = 0.0
    for n, b_n in enumerate(b):
        others = [j for j in range(len(b)) if j != n]
        denominator = sum(b[j] for j in others)
        if denominator == 0:
            continue
        numerator = 0.0
        for j in others:
            if b[j] > 0 and b_n > 0:
                numerator += b[j] * (1 - abs(b[j] - b_n) / (b[j] + b_n))
        total += b_n * numerator / denominator
    return total


def test_uniform_evidence_without_evidence_is_fully_vacuous():
    assert vacuity(torch.zeros(7)).item() == 1.0
    assert belief(torch.zeros(7)).sum().item() == 0.0
    assert dissonance(belief(torch.zeros(7))).item() == 0.0


@pytest.mark.parametrize("n", [2, 5, 20], ids=lambda n: f"{n}-way")
def test_beliefs_and_vacuity_sum_to_one_and_expected_probability_is_normalised(n):
    evidence = torch.rand(100, n, dtype=torch.float64) * 10
    assert torch.allclose(belief(evidence).sum(-1) + vacuity(evidence), torch.ones(100, dtype=torch.float64))
    assert torch.allclose(expected_probability(evidence).sum(-1), torch.ones(100, dtype=torch.float64))
    assert torch.allclose(vacuity(evidence), n / (evidence.sum(-1) + n))


def test_two_equal_beliefs_give_the_hand_computed_dissonance():
    # b = (0.3, 0.3, 0): Bal = 1 between the two, so dis = 0.3 * 0.3/0.3 + 0.3 * 0.3/0.3 = 0.6.
    assert dissonance(torch.tensor([0.3, 0.3, 0.0], dtype=torch.float64)).item() == pytest.approx(0.6)
    # Three equal beliefs of 0.2: each term is 0.2 * (0.4 / 0.4) -> 0.6.
    assert dissonance(torch.tensor([0.2, 0.2, 0.2], dtype=torch.float64)).item() == pytest.approx(0.6)
    # b = (0.6, 0.2): Bal = 1 - 0.4/0.8 = 0.5 -> dis = 0.6 * 0.5 + 0.2 * 0.5 = 0.4.
    assert dissonance(torch.tensor([0.6, 0.2], dtype=torch.float64)).item() == pytest.approx(0.4)


def test_a_single_nonzero_belief_has_no_dissonance():
    assert dissonance(torch.tensor([0.0, 0.9, 0.0])).item() == 0.0


def test_dissonance_matches_a_literal_loop_over_the_paper_formula():
    rng = np.random.default_rng(0)
    cases = []
    for n in (2, 3, 5, 20):
        for _ in range(50):
            evidence = rng.exponential(rng.choice([0.1, 1, 10, 100]), size=n)
            evidence[rng.random(n) < 0.3] = 0.0
            cases.append(evidence)
        cases += [np.zeros(n), np.full(n, 3.0), np.r_[5.0, np.zeros(n - 1)]]
    for evidence in cases:
        masses = belief(torch.tensor(evidence, dtype=torch.float64))
        expected = literal_dissonance(masses.tolist())
        assert dissonance(masses).item() == pytest.approx(expected, abs=1e-12), evidence


def test_dissonance_is_vectorised_over_leading_dimensions():
    masses = belief(torch.rand(3, 4, 6, dtype=torch.float64) * 5)
    batched = dissonance(masses)
    assert batched.shape == (3, 4)
    for i, j in itertools.product(range(3), range(4)):
        assert batched[i, j].item() == pytest.approx(literal_dissonance(masses[i, j].tolist()), abs=1e-12)


def test_incorrect_and_correct_belief():
    masses = torch.tensor([[0.5, 0.2, 0.1], [0.0, 0.0, 0.7]])
    labels = torch.tensor([0, 2])
    assert torch.allclose(incorrect_belief(masses, labels), torch.tensor([0.3, 0.0]))
    assert torch.allclose(correct_belief(masses, labels), torch.tensor([0.5, 0.7]))


def _theorem_one_holds(masses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return incorrect_belief(masses, labels) >= dissonance(masses) / 2 - 1e-12


def test_theorem_one_on_ten_thousand_generated_belief_vectors_with_zeros_ties_and_near_ties():
    rng = np.random.default_rng(1)
    vectors, labels = [], []
    for n in (2, 3, 5, 10, 20):
        count = 2500
        evidence = rng.exponential(rng.choice([0.01, 1.0, 100.0], size=(count, 1)), size=(count, n))
        evidence[rng.random((count, n)) < 0.25] = 0.0  # zeros
        ties = rng.random(count) < 0.2
        evidence[ties] = evidence[ties, :1]  # exact ties
        near = rng.random(count) < 0.2
        evidence[near] = evidence[near, :1] * (1 + 1e-9 * rng.standard_normal((near.sum(), n)))  # near-ties
        vectors.append(belief(torch.tensor(evidence, dtype=torch.float64)))
        labels.append(torch.tensor(rng.integers(0, n, size=count)))
        assert _theorem_one_holds(vectors[-1], labels[-1]).all()
    assert sum(v.shape[0] for v in vectors) >= 10_000


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0.0), st.floats(0, 1e6), st.sampled_from([1.0, 2.0, 1.0 + 1e-12])), min_size=2, max_size=12
    ),
    st.integers(min_value=0),
)
def test_theorem_one_property(evidence, label_seed):
    masses = belief(torch.tensor(evidence, dtype=torch.float64))
    label = torch.tensor(label_seed % len(evidence))
    assert _theorem_one_holds(masses, label)


def test_every_label_satisfies_theorem_one_for_adversarial_vectors():
    # The bound is tightest when belief is split evenly: check every label position.
    for masses in ([0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [0.45, 0.45, 0.0], [1e-300, 1e-300, 0.3]):
        masses = torch.tensor(masses, dtype=torch.float64)
        for y in range(masses.numel()):
            assert _theorem_one_holds(masses, torch.tensor(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_safe_at_huge_and_zero_evidence(dtype):
    big = torch.finfo(dtype).max
    evidence = torch.tensor([[big, big, 0.0], [big, 0.0, 0.0], [0.0, 0.0, 0.0], [1e30, 1.0, 1e30]], dtype=dtype)
    for value in (belief(evidence), vacuity(evidence), dissonance(belief(evidence)), expected_probability(evidence)):
        assert torch.isfinite(value).all()
    assert dissonance(belief(evidence))[0].item() == pytest.approx(1.0, abs=1e-6)
    assert vacuity(evidence)[2].item() == 1.0


def test_gradients_are_finite_through_zero_beliefs():
    evidence = torch.tensor([[0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], requires_grad=True)
    tb = task_beliefs(evidence.unsqueeze(0), torch.tensor([[2, 0, 1]]))
    (tb.vacuity + tb.dissonance + tb.incorrect).sum().backward()
    assert torch.isfinite(evidence.grad).all()


def test_task_beliefs_average_over_the_query_set():
    evidence = torch.rand(4, 3, 10, 5) * 4
    labels = torch.randint(0, 5, (4, 3, 10))
    tb = task_beliefs(evidence, labels)
    assert tb.vacuity.shape == tb.dissonance.shape == tb.incorrect.shape == (4, 3)
    assert torch.allclose(tb.vacuity, vacuity(evidence).mean(-1))
    assert torch.allclose(tb.incorrect + tb.correct + tb.vacuity, belief(evidence).sum(-1).mean(-1) + tb.vacuity)
    assert task_beliefs(evidence).incorrect is None


def test_task_uncertainty_weights_vacuity_by_lambda():
    vb, cb = torch.tensor([0.9, 0.1]), torch.tensor([0.1, 0.9])
    assert torch.allclose(task_uncertainty(vb, cb, 1.0), vb)
    assert torch.allclose(task_uncertainty(vb, cb, 0.0), cb)
    assert task_uncertainty(vb, cb, 0.25)[1].item() == pytest.approx(0.25 * 0.1 + 0.75 * 0.9)
    with pytest.raises(ValueError, match="lambda"):
        task_uncertainty(vb, cb, 1.5)
    assert math.isclose(float(task_uncertainty(vb, cb, torch.tensor(0.5))[0]), 0.5)

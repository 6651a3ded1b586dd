"""Acquisition functions and the samplers built on them: each picks what its score says, within the budget."""

from __future__ import annotations

import math

import pytest
import torch

from units_lightning.belief import task_beliefs, task_uncertainty
from units_lightning.ledger import LabelLedger
from units_lightning.samplers import (
    DiverseSampler,
    EntropySampler,
    MarginSampler,
    MultiQuerySampler,
    RandomSampler,
    StochasticSampler,
    TaskSampler,
    TypicalitySampler,
    VacuitySampler,
)
from units_lightning.samplers import stochastic as stochastic_module
from units_lightning.samplers.acquisition import (
    diverse_order,
    entropy_score,
    gumbel_noise,
    kmeans,
    margin_score,
    perturbed_scores,
    set_features,
    typical_cluster_points,
    typicality,
    units_score,
    vacuity_score,
)

# Hand-built evidence of single queries over 3 classes, with what each score makes of it:
CONFIDENT = [1000.0, 0.0, 0.0]  # vacuity 0.003, entropy ~0, margin score ~0
EVEN = [3.0, 3.0, 3.0]  # vacuity 0.25, uniform probabilities: entropy log 3 (the most), margin score 1
SPARSE = [2.0, 0.0, 0.0]  # vacuity 0.6 (the most), probabilities (0.6, 0.2, 0.2): entropy 0.95, margin score 0.6
TORN = [1000.0, 1000.0, 0.0]  # vacuity 0.0015, probabilities ~(0.5, 0.5, 0): entropy ~0.69, margin score 1
# Two tasks of three candidate sets (two identical queries each): (T, Q, M, N) = (2, 3, 2, 3).
EVIDENCE = torch.tensor([[[q, q] for q in (CONFIDENT, EVEN, SPARSE)], [[q, q] for q in (CONFIDENT, SPARSE, TORN)]])
EXPECTED_PICK = {  # the candidate each task labels
    "vacuity": [2, 1],
    "entropy": [1, 1],
    "margin": [1, 2],
    "units-lambda-1": [2, 1],
    "units-lambda-0": [1, 2],  # dissonance alone: the torn set, and the even set (uniform beliefs conflict)
}


def one_per_task(picks: list[int], num_sets: int = 3) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(picks), num_sets).bool()


def test_scores_match_their_closed_forms():
    torch.testing.assert_close(vacuity_score(EVIDENCE)[1], torch.tensor([3 / 1003, 0.6, 3 / 2003]))
    torch.testing.assert_close(entropy_score(EVIDENCE)[0, 1], torch.tensor(math.log(3)))
    sparse = -(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2))
    torch.testing.assert_close(entropy_score(EVIDENCE)[1, 1], torch.tensor(sparse))
    torch.testing.assert_close(margin_score(EVIDENCE)[1], torch.tensor([3 / 1003, 0.6, 1.0]))
    features = set_features(EVIDENCE)
    assert features.shape == (2, 3, 6)
    torch.testing.assert_close(features[0, 1], torch.tensor([1 / 3] * 6))
    torch.testing.assert_close(features[1, 1], torch.tensor([0.6, 0.2, 0.2, 0.6, 0.2, 0.2]))


def test_the_default_score_is_the_papers_task_uncertainty_bit_for_bit():
    evidence = torch.rand(4, 8, 5, 5) * 10
    beliefs = task_beliefs(evidence)
    expected = task_uncertainty(beliefs.vacuity, beliefs.dissonance, 0.7)
    assert torch.equal(units_score(evidence, 0.7), expected)
    for sampler in (MultiQuerySampler(), TaskSampler(), RandomSampler(), StochasticSampler()):
        assert torch.equal(sampler.score(evidence, 0.7), expected), type(sampler).__name__
    assert torch.equal(MultiQuerySampler().priority(expected, 5), expected)


@pytest.mark.parametrize(
    "sampler,lam,expected",
    [
        (VacuitySampler(tasks=2, query_sets=3), 0.3, "vacuity"),
        (EntropySampler(tasks=2, query_sets=3), 0.3, "entropy"),
        (MarginSampler(tasks=2, query_sets=3), 0.3, "margin"),
        (MultiQuerySampler(tasks=2, query_sets=3), 1.0, "units-lambda-1"),
        (MultiQuerySampler(tasks=2, query_sets=3), 0.0, "units-lambda-0"),
        (StochasticSampler(tasks=2, query_sets=3, scorer=MarginSampler(), temperature=1e-4), 0.3, "margin"),
        (DiverseSampler(tasks=2, query_sets=3, scorer=EntropySampler(), weight=0.0), 0.3, "entropy"),
    ],
    ids=["vacuity", "entropy", "margin", "units-lambda-1", "units-lambda-0", "cold-stochastic-margin", "diverse-w0"],
)
def test_each_acquisition_labels_the_set_its_score_ranks_first(sampler, lam, expected):
    scores = sampler.score(EVIDENCE, lam)
    chosen = sampler.select(scores, step=0)
    assert torch.equal(chosen, one_per_task(EXPECTED_PICK[expected]))
    assert sampler.chosen_count(0) in (None, int(chosen.sum()))


def test_typicality_is_the_inverse_mean_distance_to_the_nearest_points():
    points = torch.tensor([[0.0], [1.0], [3.0]])
    torch.testing.assert_close(typicality(points, neighbours=1), torch.tensor([1.0, 1.0, 0.5]), rtol=1e-5, atol=0)
    torch.testing.assert_close(typicality(points, neighbours=2), torch.tensor([1 / 2, 1 / 1.5, 1 / 2.5]))
    missing = typicality(points, neighbours=2, valid=torch.tensor([True, True, False]))
    torch.testing.assert_close(missing, torch.tensor([1.0, 1.0, 0.0]), rtol=1e-5, atol=0)


def blobs() -> torch.Tensor:
    """Two clusters around (0, 0) and (10, 10), each with its centre as its most typical point."""
    around = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    return torch.cat([around, around[:3] + 10])


def test_kmeans_finds_the_two_blobs_and_typical_points_are_their_centres():
    features = blobs()
    assignment = kmeans(features, 2)
    assert len(set(assignment[:5].tolist())) == 1 and len(set(assignment[5:].tolist())) == 1
    assert assignment[0] != assignment[5]
    scores = typical_cluster_points(features, 2, neighbours=2)
    assert set(scores.topk(2).indices.tolist()) == {0, 5}
    assert (scores[[0, 5]] > 1).all() and (scores[[1, 2, 3, 4, 6, 7]] <= 1).all()


def test_the_typicality_sampler_never_labels_an_outlier():
    evidence = torch.tensor([[SPARSE, SPARSE]]).expand(3, 3, 2, 3).clone()  # nine alike candidate sets
    evidence[0, 0] = torch.tensor([CONFIDENT, CONFIDENT])  # and one unlike them
    sampler = TypicalitySampler(tasks=3, query_sets=3, neighbours=3)
    chosen = sampler.select(sampler.score(evidence, 0.5), step=0)
    assert not chosen[0, 0] and chosen.sum(1).tolist() == [1, 1, 1]


def test_diversity_takes_a_less_uncertain_set_unlike_the_sets_already_chosen():
    scores = torch.tensor([[1.0, 0.1], [0.9, 0.8], [0.2, 0.1]])
    features = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.0, -1.0]]])
    greedy = diverse_order(scores, features, weight=0.0, rounds=1)
    assert greedy.argmax(1).tolist() == [0, 0, 0]  # no weight: each task's top set
    diverse = diverse_order(scores, features, weight=1.0, rounds=1)
    assert diverse.argmax(1).tolist() == [0, 1, 0]  # task 1's top set is task 0's twin: its other one instead
    assert (diverse > 0).sum() == 3  # one round: one set per task
    everything = diverse_order(scores, features, weight=1.0)
    assert sorted(everything.flatten().tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # every candidate in order
    first_round = everything.flatten().topk(3).indices // 2
    assert sorted(first_round.tolist()) == [0, 1, 2]  # one per task before a second from any


def test_stochastic_acquisition_is_reproducible_per_seed_and_step():
    scores = torch.rand(16, 8)
    sampler = StochasticSampler(tasks=16, query_sets=8, seed=3)
    same = [StochasticSampler(tasks=16, query_sets=8, seed=3).select(scores, step=7) for _ in range(2)]
    assert torch.equal(same[0], same[1]) and torch.equal(sampler.select(scores, 7), same[0])
    assert not torch.equal(StochasticSampler(tasks=16, query_sets=8, seed=4).select(scores, 7), same[0])
    assert not torch.equal(sampler.select(scores, 8), same[0])
    assert not torch.equal(gumbel_noise((4, 4), 3, 7, rank=0), gumbel_noise((4, 4), 3, 7, rank=1))
    assert sampler.chosen_count(7) is None  # noise from the host: the step runs eagerly
    assert StochasticSampler(tasks=16, warmup_steps=10).chosen_count(3) == 16


def test_each_rank_draws_its_own_noise(monkeypatch):
    scores = torch.rand(16, 8)
    sampler = StochasticSampler(tasks=16, query_sets=8, seed=3)
    first = sampler.select(scores, 7)
    monkeypatch.setattr(stochastic_module, "_rank", lambda: 1)
    assert not torch.equal(sampler.select(scores, 7), first)


@pytest.mark.parametrize("mode", ["power", "softmax"])
def test_stochastic_acquisition_samples_in_proportion_to_the_weights(mode):
    rows = 20_000
    scores = torch.tensor([0.1, 0.3, 0.6]).log().exp().expand(rows, 3)
    weights = torch.tensor([0.1, 0.3, 0.6]) if mode == "power" else torch.tensor([0.1, 0.3, 0.6]).exp()
    sampler = StochasticSampler(tasks=rows, query_sets=3, mode=mode, temperature=1.0)
    frequency = sampler.select(scores, step=0).float().mean(0)
    torch.testing.assert_close(frequency, weights / weights.sum(), atol=0.015, rtol=0)


def test_perturbed_scores_keep_missing_candidates_last_and_refuse_a_bad_temperature():
    scores = torch.tensor([0.5, float("-inf"), 0.0])
    for mode in ("power", "softmax"):
        perturbed = perturbed_scores(scores, gumbel_noise((3,), 0, 0), 0.5, mode)
        assert perturbed[1] == float("-inf") and torch.isfinite(perturbed[[0, 2]]).all()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        StochasticSampler(temperature=0.0)
    with pytest.raises(ValueError, match="mode must be"):
        perturbed_scores(scores, torch.zeros(3), 1.0, "linear")


NEW_SAMPLERS = {
    "vacuity": lambda: VacuitySampler(tasks=2, query_sets=3),
    "entropy": lambda: EntropySampler(tasks=2, query_sets=3),
    "margin": lambda: MarginSampler(tasks=2, query_sets=3),
    "typicality": lambda: TypicalitySampler(tasks=2, query_sets=3, neighbours=2),
    "stochastic": lambda: StochasticSampler(tasks=2, query_sets=3, scorer=MarginSampler(), seed=1),
    "diverse": lambda: DiverseSampler(tasks=2, query_sets=3, weight=0.5),
}


@pytest.mark.parametrize("name", list(NEW_SAMPLERS))
@pytest.mark.parametrize("budget,spent", [(5, 0), (9, 6), (6, 2)], ids=["left-5", "left-3", "left-4"])
def test_ranks_split_what_is_left_of_the_budget_and_never_exceed_it(name, budget, spent):
    """Two ranks (simulated): each chooses on its own candidates, the ledger trims each to its share of what is left."""
    labeled = []
    for rank in (0, 1):
        sampler = NEW_SAMPLERS[name]()
        ledger = LabelLedger(budget)
        ledger.start(1, rank=rank, world_size=2)
        ledger.query_sets = spent
        evidence = torch.rand(2, 3, 4, 3) * (rank + 1) * 5
        scores = sampler.score(evidence, 0.5)
        chosen = sampler.select(scores, step=0)
        kept = ledger.within_budget(chosen, priority=scores, count=sampler.chosen_count(0))
        assert int(kept.sum()) <= ledger.share and (kept <= chosen).all()
        labeled.append(int(kept.sum()))
    left = budget - spent
    assert sum(labeled) <= left and sum(labeled) >= min(left - 1, 4)  # at most W - 1 sets short

"""Acquisition functions: how informative (or representative) each candidate query set is, from its evidence.

Pure functions on tensors; the sampler classes of this package call them. A candidate query set is described by the
evidence of its unlabeled queries, ``evidence``: (T, Q, M, N) for T tasks of Q candidate sets of M queries over N
classes (``loss.evidence`` of the adapted model's logits; never labels). Scores are (T, Q), higher = label first.

Per-set scores look at one set at a time:

* ``units_score``: the paper's task uncertainty ``lambda * mean vacuity + (1 - lambda) * mean dissonance``;
* ``vacuity_score``: mean vacuity alone (the evidence the model lacks);
* ``entropy_score`` and ``margin_score``: mean entropy, and mean ``1 - (p_1 - p_2)``, of the expected probabilities
  ``alpha / S`` (the classic active-learning scores; margin is a strong cheap baseline).

Cross-set functions compare the candidates of one call with each other, through a feature vector per set
(``set_features``: the mean expected-probability vector of its queries and their mean sorted probability profile, 2N
numbers; computed from the evidence, not from the network's penultimate layer):

* ``typicality`` and ``kmeans``, combined by ``typical_cluster_points`` (TypiClust: the densest point of each cluster);
* ``diverse_order``: a greedy order that penalises sets close to those already taken, one per task per round;
* ``gumbel_noise`` and ``perturbed_scores``: stochastic acquisition (the top of ``perturbed_scores`` is a sample
  without replacement in proportion to a softmax or a power of the score: the Gumbel-top-k trick).

Every function is free of device-to-host reads and data-dependent Python branches (tensors are indexed with
``index_select``, never with a 0-d tensor, which reads it back), so that a training step that calls it can be replayed
as a CUDA graph (``gumbel_noise`` draws on the host: see ``StochasticSampler``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from units_lightning.belief import expected_probability, task_beliefs, task_uncertainty

__all__ = [
    "diverse_order",
    "entropy_score",
    "gumbel_noise",
    "kmeans",
    "margin_score",
    "perturbed_scores",
    "set_features",
    "typical_cluster_points",
    "typicality",
    "units_score",
    "vacuity_score",
]


def units_score(evidence: Tensor, lam: float | Tensor) -> Tensor:
    """The paper's task uncertainty of every query set (Eq. 7): what ``MultiQuerySampler`` ranks by.

    Args:
        evidence: (..., M, N) non-negative evidence of the M queries of each set.
        lam: weight of vacuity, in [0, 1].

    Returns:
        (...) ``lam * mean vacuity + (1 - lam) * mean dissonance``.

    Example:
        >>> units_score(torch.tensor([[[3.0, 0.0], [1.0, 1.0]]]), 0.5)
        tensor([0.3500])
    """
    beliefs = task_beliefs(evidence)
    return task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam)


def vacuity_score(evidence: Tensor) -> Tensor:
    """Mean vacuity ``N / S`` of each set's queries: how little evidence the adapted model has.

    Args:
        evidence: (..., M, N) non-negative evidence.

    Returns:
        (...) in (0, 1].

    Example:
        >>> vacuity_score(torch.tensor([[[3.0, 0.0], [1.0, 1.0]]]))
        tensor([0.4500])
    """
    return task_beliefs(evidence).vacuity


def entropy_score(evidence: Tensor) -> Tensor:
    """Mean entropy (nats) of the expected probabilities ``alpha / S`` of each set's queries.

    Args:
        evidence: (..., M, N) non-negative evidence.

    Returns:
        (...) in [0, log N]; log N for queries without evidence.

    Example:
        >>> entropy_score(torch.zeros(1, 3, 4))  # no evidence: uniform probabilities
        tensor([1.3863])
    """
    probability = expected_probability(evidence)
    return -(probability * probability.clamp_min(torch.finfo(probability.dtype).tiny).log()).sum(-1).mean(-1)


def margin_score(evidence: Tensor) -> Tensor:
    """Mean ``1 - (p_1 - p_2)`` over each set's queries, with p_1 >= p_2 the two largest expected probabilities.

    Higher means a closer call between the two likeliest classes (margin sampling, reversed so that higher is more
    informative, as every score here).

    Args:
        evidence: (..., M, N) non-negative evidence, N >= 2.

    Returns:
        (...) in [0, 1].

    Example:
        >>> margin_score(torch.tensor([[[8.0, 0.0], [1.0, 1.0]]]))
        tensor([0.6000])
    """
    top = expected_probability(evidence).topk(2, dim=-1).values
    return (1 - (top[..., 0] - top[..., 1])).mean(-1)


def set_features(evidence: Tensor) -> Tensor:
    """A vector describing each query set, from its queries' expected probabilities (no labels, no network layer).

    The first N numbers are the mean expected-probability vector (which of the task's classes the set's queries are
    predicted as); the last N the mean of each query's probabilities sorted in decreasing order (how peaked the
    predictions are, whatever the class order, so that sets of different tasks compare).

    Args:
        evidence: (..., M, N) non-negative evidence.

    Returns:
        (..., 2N) features.
    """
    probability = expected_probability(evidence)
    profile = probability.sort(dim=-1, descending=True).values
    return torch.cat([probability.mean(-2), profile.mean(-2)], dim=-1)


def _masked_distances(features: Tensor, valid: Tensor) -> Tensor:
    """(P, P) Euclidean distances, ``inf`` to oneself and to invalid points."""
    distance = torch.cdist(features, features)
    self_or_invalid = torch.eye(len(features), dtype=torch.bool, device=features.device) | ~valid[None, :]
    return distance.masked_fill(self_or_invalid, float("inf"))


def typicality(features: Tensor, neighbours: int = 20, valid: Tensor | None = None) -> Tensor:
    """TypiClust's typicality: the inverse of the mean distance to a point's ``neighbours`` nearest other points.

    Args:
        features: (P, D) one vector per candidate.
        neighbours: nearest points averaged over (fewer when fewer points are valid).
        valid: (P,) bool, the candidates that exist (default all); invalid ones neither count as neighbours nor
            get a typicality (0).

    Returns:
        (P,) typicality, >= 0; higher = in a denser region.
    """
    valid = torch.ones(len(features), dtype=torch.bool, device=features.device) if valid is None else valid
    k = max(1, min(neighbours, len(features) - 1))
    nearest = _masked_distances(features, valid).topk(k, dim=1, largest=False).values
    finite = torch.isfinite(nearest)
    mean = torch.where(finite, nearest, torch.zeros_like(nearest)).sum(1) / finite.sum(1).clamp_min(1)
    return torch.where(valid, 1 / (mean + torch.finfo(features.dtype).eps), torch.zeros_like(mean))


def kmeans(features: Tensor, clusters: int, iterations: int = 10, valid: Tensor | None = None) -> Tensor:
    """k-means (Lloyd) with a deterministic farthest-point start: no random seed, no device read.

    The first centre is the first valid point; each next one the valid point farthest from the centres so far. An
    empty cluster keeps its centre.

    Args:
        features: (P, D); clusters: k (at most P); iterations: Lloyd steps.
        valid: (P,) bool, points that take part (default all); an invalid point is assigned but moves no centre.

    Returns:
        (P,) cluster index of every point.
    """
    valid = torch.ones(len(features), dtype=torch.bool, device=features.device) if valid is None else valid
    weight = valid.to(features.dtype)
    first = valid.to(torch.uint8).argmax()  # the first valid point
    centres = features.index_select(0, first.view(1))
    closest = torch.cdist(features, centres)[:, 0]
    for _ in range(1, clusters):
        farthest = torch.where(valid, closest, torch.full_like(closest, -1.0)).argmax()
        centre = features.index_select(0, farthest.view(1))
        centres = torch.cat([centres, centre])
        closest = torch.minimum(closest, torch.cdist(features, centre)[:, 0])
    for _ in range(iterations):
        members = torch.nn.functional.one_hot(torch.cdist(features, centres).argmin(1), clusters).to(features.dtype)
        members = members * weight[:, None]
        counts = members.sum(0)
        moved = (members.T @ features) / counts.clamp_min(1)[:, None]
        centres = torch.where(counts[:, None] > 0, moved, centres)
    return torch.cdist(features, centres).argmin(1)


def typical_cluster_points(
    features: Tensor, clusters: int, neighbours: int = 20, valid: Tensor | None = None, iterations: int = 10
) -> Tensor:
    """Representativeness as TypiClust: cluster the candidates, then prefer the most typical point of each cluster.

    Args:
        features: (P, D); clusters: k-means clusters (at most the valid points); neighbours: see ``typicality``.
        valid: (P,) bool, the candidates that exist (default all).
        iterations: Lloyd steps of ``kmeans``.

    Returns:
        (P,) scores: ``1 + t`` for the most typical point of each cluster and ``t`` for the others, with ``t`` the
        typicality scaled to (0, 1] by its maximum (0 for invalid points): every cluster's representative ranks
        above every other point, and the representatives rank among themselves by typicality.
    """
    valid = torch.ones(len(features), dtype=torch.bool, device=features.device) if valid is None else valid
    typical = typicality(features, neighbours, valid)
    typical = typical / typical.amax().clamp_min(torch.finfo(typical.dtype).tiny)
    assignment = kmeans(features, clusters, iterations, valid)
    member = (assignment[None, :] == torch.arange(clusters, device=features.device)[:, None]) & valid[None, :]
    within = torch.where(member, typical[None, :], torch.full_like(member, -1.0, dtype=typical.dtype))
    representative = within.argmax(1)  # (clusters,)
    bonus = torch.zeros_like(typical).scatter_add(0, representative, member.any(1).to(typical.dtype)).clamp_max(1)
    return typical + bonus


def diverse_order(
    scores: Tensor, features: Tensor, weight: float = 1.0, available: Tensor | None = None, rounds: int | None = None
) -> Tensor:
    """A greedy order of the candidates that trades score for diversity, one set per task per round.

    At each pick the candidate of highest ``score - weight * closeness`` among the tasks not yet served this round
    is taken, where closeness is its largest cosine similarity (floored at 0) to the sets taken so far, of features
    centred on the candidates' mean. A round ends when every task with candidates left has given one.

    Args:
        scores: (T, Q) acquisition scores (-inf where there is no candidate).
        features: (T, Q, D) one vector per candidate.
        weight: how much closeness to the chosen sets costs, in units of the score.
        available: (T, Q) bool, the candidates that exist (default: where ``scores`` is finite).
        rounds: picks stop after this many rounds (default: until every candidate is ordered); the training step's
            one-set-per-task rule needs one.

    Returns:
        (T, Q) priorities: ``P - i`` for the candidate picked i-th (P = T * Q), 0 for those not picked.
    """
    num_tasks, num_sets = scores.shape
    size = num_tasks * num_sets
    available = torch.isfinite(scores) if available is None else available & torch.isfinite(scores)
    remaining = available.flatten().clone()
    flat_scores = torch.where(remaining, scores.flatten(), torch.zeros_like(scores.flatten()))
    flat = features.reshape(size, -1)
    weights = remaining.to(flat.dtype)
    centred = flat - (weights[:, None] * flat).sum(0) / weights.sum().clamp_min(1)
    unit = centred / centred.norm(dim=1, keepdim=True).clamp_min(torch.finfo(flat.dtype).eps)
    similarity = (unit @ unit.T).clamp_min(0)
    task_of = torch.arange(size, device=scores.device) // num_sets
    open_tasks = torch.ones(num_tasks, dtype=torch.bool, device=scores.device)
    closeness = torch.zeros_like(flat_scores)
    priority = torch.zeros_like(flat_scores)
    minus_inf = torch.full_like(flat_scores, float("-inf"))
    picks = size if rounds is None else min(size, rounds * num_tasks)
    for i in range(picks):
        eligible = remaining & open_tasks[task_of]
        open_tasks = open_tasks | ~eligible.any()  # a new round: every task may give one again
        eligible = remaining & open_tasks[task_of]
        found = eligible.any()
        pick = torch.where(eligible, flat_scores - weight * closeness, minus_inf).argmax()
        one = torch.zeros_like(remaining).scatter(0, pick.view(1), found.view(1))  # the pick, if any
        priority = torch.where(one, torch.full_like(priority, float(size - i)), priority)
        remaining = remaining & ~one
        served = torch.zeros_like(open_tasks).scatter(0, task_of.index_select(0, pick.view(1)), found.view(1))
        open_tasks = open_tasks & ~served
        closeness = torch.where(found, torch.maximum(closeness, similarity.index_select(0, pick.view(1))[0]), closeness)
    return priority.view(num_tasks, num_sets)


def gumbel_noise(shape: tuple[int, ...], seed: int, step: int, rank: int = 0) -> Tensor:
    """Standard Gumbel noise drawn on the host from a generator seeded by (seed, rank, step): reproducible.

    Args:
        shape: the noise's shape; seed: the sampler's seed; step: the training step (or the selection round);
        rank: the process's rank, so that ranks draw independent noise.

    Returns:
        float32 CPU tensor of ``-log(-log(u))``, u uniform in (0, 1).
    """
    state = np.random.SeedSequence([seed, rank, step]).generate_state(2, dtype=np.uint64)
    generator = torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    return (-(-uniform.log()).log()).float()


def perturbed_scores(
    scores: Tensor, noise: Tensor, temperature: float = 1.0, mode: Literal["softmax", "power"] = "softmax"
) -> Tensor:
    """Scores plus Gumbel noise, whose top-k is a sample without replacement in proportion to the scores' weights.

    The weights are ``exp(score / temperature)`` ("softmax") or ``score ** (1 / temperature)`` ("power", for
    non-negative scores; as Kirsch et al. 2023). A lower temperature approaches top-k; a higher one, uniform.

    Args:
        scores: (...) scores (-inf where there is no candidate: stays -inf).
        noise: standard Gumbel noise of the same shape (``gumbel_noise``).
        temperature: > 0.
        mode: "softmax" or "power".

    Returns:
        (...) perturbed scores, the ordering to take candidates in.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if mode == "softmax":
        logits = scores
    elif mode == "power":
        tiny = torch.finfo(scores.dtype).tiny
        logits = torch.where(torch.isfinite(scores), scores.clamp_min(tiny).log(), scores)
    else:
        raise ValueError(f"mode must be 'softmax' or 'power', got {mode!r}")
    return logits / temperature + noise.to(device=scores.device, dtype=scores.dtype)

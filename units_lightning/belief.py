"""Subjective-logic beliefs of an evidential classifier (Pandey & Yu, CVPR 2022, Section 3).

Pure functions on tensors whose last dimension indexes the N classes. Nothing here knows about models,
tasks or Lightning. For a sample with evidence ``e >= 0`` (e.g. ``softplus(logits)``):

* Dirichlet parameters ``alpha = e + 1`` with strength ``S = sum(alpha) = sum(e) + N``;
* belief masses ``b_n = e_n / S`` and vacuity ``u = N / S``, so that ``sum(b) + u = 1``;
* dissonance (conflicting belief)
  ``dis = sum_n b_n * sum_{j != n} b_j Bal(b_j, b_n) / sum_{j != n} b_j`` with
  ``Bal(b_j, b_n) = 1 - |b_j - b_n| / (b_j + b_n)`` when both beliefs are positive, else 0;
* incorrect belief ``ib = sum_n b_n (1 - y_n)`` and correct belief ``b_y`` (need the label);
* task uncertainty ``lambda * mean(u) + (1 - lambda) * mean(dis)`` over a query set (needs no label).

Theorem 1 of the paper: ``ib >= dis / 2`` for every sample. Every division is guarded: zero beliefs
contribute nothing (the paper's Proposition 1), all-zero evidence gives dissonance 0, and huge
evidence (up to the float maximum) gives finite results.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "TaskBeliefs",
    "belief",
    "correct_belief",
    "dissonance",
    "expected_probability",
    "incorrect_belief",
    "query_beliefs",
    "task_beliefs",
    "task_uncertainty",
    "theorem_one_margin",
    "vacuity",
]


def _normalised(evidence: Tensor) -> tuple[Tensor, Tensor]:
    """Evidence and class count both divided by ``max(1, max_n e_n)``, so that sums cannot overflow."""
    num_classes = evidence.shape[-1]
    scale = evidence.detach().amax(dim=-1, keepdim=True).clamp_min(1.0)
    return evidence / scale, num_classes / scale


def belief(evidence: Tensor) -> Tensor:
    """Belief masses ``b_n = e_n / (sum(e) + N)``.

    Args:
        evidence: (..., N) non-negative evidence.

    Returns:
        (..., N) beliefs in [0, 1) whose sum is ``1 - vacuity``.

    Example:
        >>> belief(torch.tensor([2.0, 0.0, 1.0]))
        tensor([0.3333, 0.0000, 0.1667])
    """
    scaled, scaled_n = _normalised(evidence)
    return scaled / (scaled.sum(dim=-1, keepdim=True) + scaled_n)


def vacuity(evidence: Tensor) -> Tensor:
    """Vacuity (uncertainty mass) ``u = N / (sum(e) + N)``: 1 without evidence, towards 0 with much.

    Args:
        evidence: (..., N) non-negative evidence.

    Returns:
        (...) vacuity in (0, 1].

    Example:
        >>> vacuity(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        tensor([1.0000, 0.5000])
    """
    scaled, scaled_n = _normalised(evidence)
    return (scaled_n / (scaled.sum(dim=-1, keepdim=True) + scaled_n)).squeeze(-1)


def expected_probability(evidence: Tensor) -> Tensor:
    """Expected class probabilities under the Dirichlet, ``alpha / S = b + u / N``.

    Args:
        evidence: (..., N) non-negative evidence.

    Returns:
        (..., N) probabilities summing to 1.
    """
    scaled, scaled_n = _normalised(evidence)
    num_classes = evidence.shape[-1]
    return (scaled + scaled_n / num_classes) / (scaled.sum(dim=-1, keepdim=True) + scaled_n)


def dissonance(belief_masses: Tensor) -> Tensor:
    """Dissonance (conflicting belief) of belief vectors, vectorised over the leading dimensions.

    ``Bal(b_j, b_n) = 1 - |b_j - b_n| / (b_j + b_n) = 2 min(b_j, b_n) / (b_j + b_n)`` for positive
    pairs and 0 otherwise; a class whose other classes carry no belief contributes 0.

    Args:
        belief_masses: (..., N) beliefs, non-negative, summing to at most 1.

    Returns:
        (...) dissonance in [0, 1).

    Example:
        >>> dissonance(torch.tensor([[0.4, 0.4, 0.0], [0.8, 0.0, 0.0], [0.0, 0.0, 0.0]]))
        tensor([0.8000, 0.0000, 0.0000])
    """
    b_n = belief_masses.unsqueeze(-1)  # (..., N, 1): the class n being assessed
    b_j = belief_masses.unsqueeze(-2)  # (..., 1, N): the other classes j
    pair_sum = b_n + b_j
    both_positive = (b_n > 0) & (b_j > 0)
    # Double `where` keeps gradients finite where the pair sum is 0.
    balance = torch.where(both_positive, 2 * torch.minimum(b_n, b_j) / torch.where(both_positive, pair_sum, 1.0), 0.0)
    off_diagonal = ~torch.eye(belief_masses.shape[-1], dtype=torch.bool, device=belief_masses.device)
    balance = balance * off_diagonal
    support = (b_j * off_diagonal).sum(dim=-1)  # (..., N): sum_{j != n} b_j
    weighted = (b_j * balance).sum(dim=-1)  # (..., N): sum_{j != n} b_j Bal(b_j, b_n)
    ratio = torch.where(support > 0, weighted / torch.where(support > 0, support, 1.0), 0.0)
    return (belief_masses * ratio).sum(dim=-1)


def incorrect_belief(belief_masses: Tensor, labels: Tensor) -> Tensor:
    """Belief placed on wrong classes, ``sum_n b_n (1 - y_n)``.

    Args:
        belief_masses: (..., N) beliefs.
        labels: (...) class indices in ``[0, N)``.

    Returns:
        (...) incorrect belief in [0, 1).

    Example:
        >>> incorrect_belief(torch.tensor([0.5, 0.3, 0.1]), torch.tensor(0))
        tensor(0.4000)
    """
    return belief_masses.sum(dim=-1) - correct_belief(belief_masses, labels)


def correct_belief(belief_masses: Tensor, labels: Tensor) -> Tensor:
    """Belief placed on the true class, ``b_y``.

    Args:
        belief_masses: (..., N) beliefs.
        labels: (...) class indices in ``[0, N)``.

    Returns:
        (...) correct belief in [0, 1).
    """
    return belief_masses.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


class TaskBeliefs(NamedTuple):
    """Beliefs averaged over the query samples of each task (the paper's ``vb_t``, ``cb_t``, ``ib_t``).

    ``incorrect`` and ``correct`` are ``None`` when no labels were given.
    """

    vacuity: Tensor
    dissonance: Tensor
    incorrect: Tensor | None = None
    correct: Tensor | None = None


def query_beliefs(evidence: Tensor, labels: Tensor | None = None) -> TaskBeliefs:
    """Vacuity, dissonance and (with labels) incorrect and correct belief of every query sample.

    Args:
        evidence: (..., N) evidence of each query sample.
        labels: (...) class indices, or None for unlabeled queries.

    Returns:
        TaskBeliefs of tensors of shape (...), one value per query.

    Example:
        >>> q = query_beliefs(torch.tensor([[3.0, 0.0], [1.0, 1.0]]), torch.tensor([0, 1]))
        >>> [[round(float(v), 4) for v in x] for x in q]
        [[0.4, 0.5], [0.0, 0.5], [0.0, 0.25], [0.6, 0.25]]
    """
    masses = belief(evidence)
    vac, dis = vacuity(evidence), dissonance(masses)
    if labels is None:
        return TaskBeliefs(vac, dis)
    return TaskBeliefs(vac, dis, incorrect_belief(masses, labels), correct_belief(masses, labels))


def task_beliefs(evidence: Tensor, labels: Tensor | None = None) -> TaskBeliefs:
    """Task-level mean vacuity, dissonance and (with labels) incorrect and correct belief.

    Args:
        evidence: (..., n_query, N) evidence of every query sample of each task.
        labels: (..., n_query) class indices, or None for unlabeled query sets.

    Returns:
        TaskBeliefs of tensors of shape (...).

    Example:
        >>> t = task_beliefs(torch.tensor([[[3.0, 0.0], [1.0, 1.0]]]), torch.tensor([[0, 1]]))
        >>> [round(float(x), 4) for x in t]
        [0.45, 0.25, 0.125, 0.425]
    """
    return TaskBeliefs(*(None if x is None else x.mean(dim=-1) for x in query_beliefs(evidence, labels)))


def task_uncertainty(vacuous_belief: Tensor, conflicting_belief: Tensor, lam: float | Tensor) -> Tensor:
    """Task uncertainty score ``lambda * vacuous + (1 - lambda) * conflicting`` (paper Eq. 7).

    Args:
        vacuous_belief: (...) mean vacuity of each task's query set.
        conflicting_belief: (...) mean dissonance of each task's query set.
        lam: weight of the vacuous belief, in [0, 1].

    Returns:
        (...) scores; higher means more informative to label.

    Example:
        >>> task_uncertainty(torch.tensor([0.8, 0.2]), torch.tensor([0.1, 0.6]), 0.5)
        tensor([0.4500, 0.4000])
    """
    if not isinstance(lam, Tensor) and not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must lie in [0, 1], got {lam}")
    return lam * vacuous_belief + (1 - lam) * conflicting_belief


def theorem_one_margin(incorrect_belief: Tensor, dissonance: Tensor) -> Tensor:
    """Per-task slack of Theorem 1, ``ib_t - cb_t / 2`` (non-negative whenever the theorem holds).

    Args:
        incorrect_belief: (T, M) incorrect belief of each of the M queries of T tasks, in [0, 1).
        dissonance: (T, M) dissonance of the same queries, in [0, 1).

    Returns:
        (T,) ``mean(incorrect_belief) - mean(dissonance) / 2`` per task.

    Example:
        >>> b = torch.tensor([0.4, 0.4, 0.0])  # two equal beliefs: dissonance 0.8, the bound is tight
        >>> theorem_one_margin(torch.tensor([[0.4]]), torch.tensor([[0.8]]))
        tensor([0.])
    """
    if incorrect_belief.shape != dissonance.shape or incorrect_belief.dim() != 2:
        raise ValueError(
            f"expected (tasks, queries) tensors of one shape, got {tuple(incorrect_belief.shape)} "
            f"and {tuple(dissonance.shape)}"
        )
    return incorrect_belief.mean(dim=-1) - dissonance.mean(dim=-1) / 2

"""Diversity: the query sets chosen in one step should not all look alike."""

from __future__ import annotations

from torch import Tensor

from units_lightning.samplers.acquisition import diverse_order, set_features
from units_lightning.samplers.base import TaskSampler
from units_lightning.samplers.multi_query import MultiQuerySampler

__all__ = ["DiverseSampler"]


class DiverseSampler(MultiQuerySampler):
    """Any score, traded against closeness to the sets already chosen in the same step, one set per task per round.

    Candidates are taken greedily (``acquisition.diverse_order``): the next is the one of highest
    ``score - weight * closeness`` among the tasks that have not given a set this round, closeness being its largest
    cosine similarity to the sets taken so far, on feature vectors computed from the queries' evidence
    (``acquisition.set_features``; not the network's penultimate features). In training this picks one set per task
    (the first round); ``units-lightning select`` takes one per task before a second from any.

    What it returns as scores, and the training logs show as the selection's uncertainty, are the greedy order's
    priorities (``P - i`` for the i-th pick of P candidates), not the scorer's scores.

    Needs what its ``scorer`` needs; the greedy order costs O(P^2 D) for P candidates and one small step per pick
    (T picks a training step), no device read.

    Args:
        tasks, query_sets, warmup_steps: as ``MultiQuerySampler``.
        scorer: the sampler whose ``score`` is traded off (only its score is used; default: the paper's task
            uncertainty).
        weight: what full closeness costs, in units of the score (0: the scorer's choice).
    """

    def __init__(
        self,
        tasks: int = 8,
        query_sets: int = 8,
        warmup_steps: int = 0,
        scorer: TaskSampler | None = None,
        weight: float = 1.0,
    ):
        super().__init__(tasks=tasks, query_sets=query_sets, warmup_steps=warmup_steps)
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        self.scorer, self.weight = scorer, weight

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        scorer = super() if self.scorer is None else self.scorer
        base = scorer.score(evidence, lam, available)
        rounds = 1 if available is None else None  # a training step keeps the first round only
        return diverse_order(base, set_features(evidence), self.weight, available, rounds)

    def _repr_fields(self) -> str:
        return f"scorer={self.scorer!r}, weight={self.weight}"

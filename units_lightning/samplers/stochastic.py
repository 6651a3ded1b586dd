"""Stochastic acquisition: sample the query sets to label in proportion to a power or softmax of their score."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from units_lightning.samplers.acquisition import gumbel_noise, perturbed_scores
from units_lightning.samplers.base import TaskSampler
from units_lightning.samplers.multi_query import MultiQuerySampler

__all__ = ["StochasticSampler"]


def _rank() -> int:
    """This process's rank under torch.distributed (0 without it)."""
    distributed = torch.distributed
    return distributed.get_rank() if distributed.is_available() and distributed.is_initialized() else 0


class StochasticSampler(MultiQuerySampler):
    """Any score's candidates sampled with a temperature instead of taking the top one (Kirsch et al., 2023).

    Each task labels one of its query sets drawn with probability proportional to ``exp(score / temperature)``
    ("softmax") or ``score ** (1 / temperature)`` ("power", for non-negative scores), by the Gumbel-top-k trick:
    Gumbel noise is added to the (transformed) scores and the top is taken, so ``units-lightning select`` asked for
    several sets draws them without replacement. The noise comes from a generator seeded by ``seed``, the process's
    rank and the step: the same seed gives the same choice.

    The noise is drawn on the host, so a training step with this sampler runs eagerly, not replayed as a CUDA graph
    (``chosen_count`` is None after warm-up) and reads the mask's size back once per step. It needs what its
    ``scorer`` needs, plus T x Q random numbers a step.

    Args:
        tasks, query_sets, warmup_steps: as ``MultiQuerySampler``.
        scorer: the sampler whose ``score`` is sampled from (only its score is used; default: the paper's task
            uncertainty, as ``MultiQuerySampler``).
        temperature: > 0; towards 0 the top one (as the scorer's own rule), large: uniform at random.
        mode: "softmax" or "power".
        seed: seeds the noise (with rank and step).
    """

    def __init__(
        self,
        tasks: int = 8,
        query_sets: int = 8,
        warmup_steps: int = 0,
        scorer: TaskSampler | None = None,
        temperature: float = 1.0,
        mode: Literal["softmax", "power"] = "power",
        seed: int = 0,
    ):
        super().__init__(tasks=tasks, query_sets=query_sets, warmup_steps=warmup_steps)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if mode not in ("softmax", "power"):
            raise ValueError(f"mode must be 'softmax' or 'power', got {mode!r}")
        self.scorer, self.temperature, self.mode, self.seed = scorer, temperature, mode, seed

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        if self.scorer is None:
            return super().score(evidence, lam, available)
        return self.scorer.score(evidence, lam, available)

    def priority(self, scores: Tensor, step: int) -> Tensor:
        """The scores perturbed by this step's noise: the order the sets are drawn in."""
        noise = gumbel_noise(tuple(scores.shape), self.seed, step, _rank())
        return perturbed_scores(scores, noise, self.temperature, self.mode)

    def select(self, scores: Tensor, step: int) -> Tensor:
        if self.warming_up(step):
            return self.warmup_choice(scores)
        return self.choose(self.priority(scores, step))

    def chosen_count(self, step: int) -> int | None:
        """One set per task during warm-up (a CUDA graph may replay it); None after: the step runs eagerly."""
        return self.tasks if self.warming_up(step) else None

    def _repr_fields(self) -> str:
        return f"scorer={self.scorer!r}, temperature={self.temperature}, mode={self.mode!r}, seed={self.seed}"

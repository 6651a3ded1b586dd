"""Multi-query samplers that rank each task's candidate query sets by another uncertainty score than the paper's."""

from __future__ import annotations

from torch import Tensor

from units_lightning.samplers.acquisition import entropy_score, margin_score, vacuity_score
from units_lightning.samplers.multi_query import MultiQuerySampler

__all__ = ["EntropySampler", "MarginSampler", "VacuitySampler"]


class VacuitySampler(MultiQuerySampler):
    """Units-ML with vacuity alone: label each task's query set of highest mean vacuity (``lambda`` ignored).

    Needs the evidence of every candidate's queries (one forward pass per candidate set, as ``MultiQuerySampler``);
    no more. Arguments as ``MultiQuerySampler``.
    """

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        return vacuity_score(evidence)


class EntropySampler(MultiQuerySampler):
    """Label each task's query set of highest mean entropy of the expected probabilities ``alpha / S``.

    Needs the evidence of every candidate's queries (one forward pass per candidate set, as ``MultiQuerySampler``);
    works with any loss that gives evidence, cross-entropy too. Arguments as ``MultiQuerySampler``.
    """

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        return entropy_score(evidence)


class MarginSampler(MultiQuerySampler):
    """Label each task's query set whose queries are the closest calls: highest mean ``1 - (p_1 - p_2)``.

    Margin sampling on the expected probabilities ``alpha / S``: a strong, cheap baseline of active learning. Needs
    the evidence of every candidate's queries (one forward pass per candidate set, as ``MultiQuerySampler``).
    Arguments as ``MultiQuerySampler``.
    """

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        return margin_score(evidence)

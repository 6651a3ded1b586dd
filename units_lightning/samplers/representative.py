"""Representativeness: label typical query sets of clusters of the candidates (TypiClust), not uncertain ones."""

from __future__ import annotations

from torch import Tensor

from units_lightning.samplers.acquisition import set_features, typical_cluster_points
from units_lightning.samplers.multi_query import MultiQuerySampler

__all__ = ["TypicalitySampler"]


class TypicalitySampler(MultiQuerySampler):
    """Label each task's most representative query set: typical points of clusters, as TypiClust.

    Every candidate set of a step (or of a ``select`` call) is described by a feature vector computed from the
    evidence of its queries (``acquisition.set_features``: the mean expected-probability vector and the mean sorted
    probability profile, 2N numbers; not the network's penultimate features, which the engines do not return). The
    candidates are clustered by k-means (``clusters`` clusters, a deterministic start: no seed) and scored by
    typicality, the inverse mean distance to their ``neighbours`` nearest candidates, plus 1 for the most typical
    set of each cluster (``acquisition.typical_cluster_points``); each task then labels its highest-scoring set.
    At low budgets representativeness is reported to beat uncertainty (TypiClust; Bae, Wang & Sutherland 2024).

    Needs the evidence of every candidate (one forward pass per candidate set, as ``MultiQuerySampler``); the rest
    costs O(P^2 D) for the P candidates of a step (distances and 10 k-means iterations), no device read.

    Args:
        tasks, query_sets, warmup_steps: as ``MultiQuerySampler``.
        clusters: k-means clusters (default: the number of tasks scored together, a cluster per set to choose).
        neighbours: nearest candidates that typicality averages the distance over.
    """

    def __init__(
        self,
        tasks: int = 8,
        query_sets: int = 8,
        warmup_steps: int = 0,
        clusters: int | None = None,
        neighbours: int = 20,
    ):
        super().__init__(tasks=tasks, query_sets=query_sets, warmup_steps=warmup_steps)
        if clusters is not None and clusters < 1:
            raise ValueError(f"clusters must be >= 1 or None, got {clusters}")
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1, got {neighbours}")
        self.clusters, self.neighbours = clusters, neighbours

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        num_tasks, num_sets = evidence.shape[:2]
        features = set_features(evidence).flatten(0, 1)
        clusters = min(self.clusters or num_tasks, num_tasks * num_sets)
        valid = None if available is None else available.flatten()
        return typical_cluster_points(features, clusters, self.neighbours, valid).view(num_tasks, num_sets)

    def _repr_fields(self) -> str:
        return f"clusters={self.clusters}, neighbours={self.neighbours}"

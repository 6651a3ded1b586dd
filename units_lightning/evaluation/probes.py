"""``ShiftProbes``: the out-of-distribution probes that ``test`` runs on every test task, with their metrics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from units_lightning import keys
from units_lightning.belief import vacuity
from units_lightning.evaluation.shifts import QueryShift
from units_lightning.metrics import ShiftMetrics

__all__ = ["ShiftProbes"]


class ShiftProbes(nn.Module):
    """Every level of every query shift, probed from the same adapted models as the clean query set.

    ``test_step`` asks for the shifted query sets (``queries``), predicts them beside the clean ones, and hands
    the logits back (``update``); ``compute`` gives the ``ood`` part of ``results.json`` and the logged numbers.
    The shifts draw from a generator seeded by (seed, batch, shift), so the probes are the same on every run.
    A shifted query keeps its (task, query) position, so it is scored against the clean label at that position
    (tests/evaluation/test_shift_alignment.py).

    Args:
        shifts: the query shifts (``Rotation``, ``Scale``, ``ForeignQueries`` or your own ``QueryShift``).
    """

    def __init__(self, shifts: Sequence[QueryShift]):
        super().__init__()
        self.shifts = list(shifts)
        self.levels = [(shift, level) for shift in self.shifts for level in shift.levels]
        self.metrics = nn.ModuleList(ShiftMetrics() for _ in self.levels)

    def queries(self, clean: Tensor, seed: int, batch_idx: int) -> list[Tensor]:
        """The shifted query sets of a batch, one (T, M, C, H, W) tensor per level that changes the queries.

        Args:
            clean: (T, M, C, H, W) the clean query sets.
            seed: the evaluation tasks' seed.
            batch_idx: the batch's index among the test batches.
        """
        queries = []
        for shift_index, shift in enumerate(self.shifts):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + batch_idx * 101 + shift_index)
            queries.extend(
                shift.shift(clean, level, generator) for level in shift.levels if not shift.is_identity(level)
            )
        return queries

    def update(
        self,
        clean_vacuity: Tensor,
        clean_logits: Tensor,
        labels: Tensor,
        shifted_logits: Sequence[Tensor],
        evidence: Callable[[Tensor], Tensor],
    ) -> dict[str, Tensor]:
        """Add a batch of probes.

        Args:
            clean_vacuity: (T, M) vacuity of the clean queries.
            clean_logits: (T, M, N) their logits (the predictions of identity levels).
            labels: (T, M) their labels (shifts that keep labels keep these).
            shifted_logits: the logits of ``queries()``'s query sets, in order.
            evidence: the loss's evidence function.

        Returns:
            ``{level name: (T, M) vacuity}``.
        """
        shifted = iter(shifted_logits)
        vacuities = {}
        for (shift, level), metrics in zip(self.levels, self.metrics, strict=True):
            logits = clean_logits if shift.is_identity(level) else next(shifted)
            level_vacuity = vacuity(evidence(logits))
            correct = logits.argmax(-1) == labels if shift.keeps_labels else None
            metrics.update(clean_vacuity, level_vacuity, correct)
            vacuities[shift.name(level)] = level_vacuity
        return vacuities

    def compute(self) -> dict[str, list[dict[str, Any]]]:
        """``{shift kind: [{"level", "name", "accuracy", "vacuity", "auroc"}, ...]}``: the ``ood`` results."""
        results: dict[str, list[dict[str, Any]]] = {}
        for (shift, level), metrics in zip(self.levels, self.metrics, strict=True):
            results.setdefault(shift.kind, []).append({"level": level, "name": shift.name(level), **metrics.compute()})
        return results

    @staticmethod
    def scalars(results: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
        """The logged numbers of ``compute()``'s results: ``test/ood/<name>/{acc,vacuity,auroc}``."""
        scalars = {}
        for row in (row for rows in results.values() for row in rows):
            for key, value in (("acc", row["accuracy"]), ("vacuity", row["vacuity"])):
                if value is not None and value["mean"] is not None:
                    scalars[keys.ood_key(row["name"], key)] = value["mean"]
            if row["auroc"] is not None:
                scalars[keys.ood_key(row["name"], "auroc")] = row["auroc"]
        return scalars

    def reset(self) -> None:
        for metrics in self.metrics:
            metrics.reset()

    def __len__(self) -> int:
        return len(self.levels)

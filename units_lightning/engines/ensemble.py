"""An ensemble of engines that is itself an engine: each member adapts on its own, logits are averaged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from units_lightning.engines.base import InnerLoss, adapt_and_predict_sets

__all__ = ["EnsembleEngine"]


def _mean(logits: Sequence[Tensor]) -> Tensor:
    total = logits[0]
    for other in logits[1:]:
        total = total + other
    return total / len(logits)


class EnsembleEngine:
    """Engines (e.g. the top-k validation checkpoints, the paper's ensembles) behind the engine interface.

    Every member adapts to each support set from its own meta-learned initialisation; ``predict`` and
    ``predict_sets`` average the adapted members' logits. Averaging logits keeps the ensemble one evidential
    classifier (evidence = activation of the mean logits), so vacuity and dissonance are computed exactly as for
    one model. The members are held in a plain list, not as submodules: they are not part of the state of the
    model that evaluates with them.

    Args:
        members: engines with the same backbone architecture (``units_lightning.evaluation.load_engines``).
    """

    def __init__(self, members: Sequence[nn.Module]):
        if not members:
            raise ValueError("EnsembleEngine needs at least one member")
        self.members = list(members)

    def to(self, device: torch.device | str) -> EnsembleEngine:
        for member in self.members:
            member.to(device)
        return self

    def adapt(self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool) -> Any:
        return [member.adapt(support_x, support_y, loss, steps, create_graph) for member in self.members]

    def predict(self, adapted: Any, query_x: Tensor, task_index: Tensor) -> Tensor:
        return _mean([m.predict(a, query_x, task_index) for m, a in zip(self.members, adapted, strict=True)])

    def predict_sets(self, adapted: Any, query_x: Tensor) -> Tensor:
        return _mean([m.predict_sets(a, query_x) for m, a in zip(self.members, adapted, strict=True)])

    def evaluate(self, support_x: Tensor, support_y: Tensor, query_x: Tensor, loss: InnerLoss, steps: int) -> Tensor:
        """The mean of the members' detached (T, Q, M, N) evaluation logits, each member evaluated on its own
        (``BatchedEngine.evaluate``: adapted, then predicted without recording a backward; one CUDA graph per
        member and shape on a GPU), so that an ensemble evaluates in one member's memory, not k members' graphs."""

        def member(engine: nn.Module) -> Tensor:
            return torch.stack(adapt_and_predict_sets(engine, support_x, support_y, query_x.unbind(1), loss, steps), 1)

        return _mean([member(engine) for engine in self.members])

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"EnsembleEngine({len(self.members)} members)"

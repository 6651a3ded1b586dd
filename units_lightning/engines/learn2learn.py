"""The reference engine: learn2learn's MAML, one ``clone()`` per task."""

from __future__ import annotations

import contextlib
import io

import torch
from torch import Tensor, nn

from units_lightning.engines.base import InnerLoss

__all__ = ["Learn2LearnEngine", "import_learn2learn"]


def import_learn2learn():
    """Import learn2learn quietly (its gym dependency prints a deprecation notice on import).

    Raises:
        ImportError: with the install recipe when learn2learn is missing.
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            import learn2learn
    except ImportError as error:
        raise ImportError(
            "learn2learn is required by Learn2LearnEngine. Run scripts/setup.sh, or install it by hand: "
            "pip install cython numpy setuptools wheel && pip install --no-build-isolation --no-deps "
            "-C--build-option=build_ext learn2learn==0.2.0"
        ) from error
    return learn2learn


class Learn2LearnEngine(nn.Module):
    """Per-task MAML with learn2learn: ``clone()`` the model, ``adapt()`` on the support loss, repeat.

    Args:
        model: the backbone whose initialisation is meta-learned.
        inner_lr: inner-loop learning rate (fixed).

    Attributes:
        maml: the ``learn2learn.algorithms.MAML`` wrapper; its parameters are the meta-parameters.
    """

    def __init__(self, model: nn.Module, inner_lr: float = 0.1):
        super().__init__()
        l2l = import_learn2learn()
        self.maml = l2l.algorithms.MAML(model, lr=inner_lr, first_order=False, allow_unused=True)

    def adapt(
        self, support_x: Tensor, support_y: Tensor, loss: InnerLoss, steps: int, create_graph: bool
    ) -> list[nn.Module]:
        learners = []
        for x, y in zip(support_x, support_y, strict=True):
            learner = self.maml.clone()
            for _ in range(steps):
                learner.adapt(loss(learner(x), y), first_order=not create_graph)
            learners.append(learner)
        return learners

    def predict(self, adapted: list[nn.Module], query_x: Tensor, task_index: Tensor) -> Tensor:
        if query_x.shape[0] == 0:
            return query_x.new_zeros(0, query_x.shape[1], self._num_outputs(adapted))
        return torch.stack([adapted[int(t)](x) for x, t in zip(query_x, task_index.tolist(), strict=True)])

    @staticmethod
    def _num_outputs(adapted: list[nn.Module]) -> int:
        return list(adapted[0].parameters())[-1].shape[0]

"""``TheoremOneMonitor``: check Theorem 1 of the paper on every training, validation and test task.

Theorem 1 (Pandey & Yu, CVPR 2022, "lower bound of incorrect belief"): for any task ``t``, the incorrect belief
``ib_t`` (mean over its query set of ``sum_n b_n (1 - y_n)``) is at least half its conflicting belief ``cb_t``
(mean dissonance over the same queries): ``ib_t >= cb_t / 2``. The proof bounds each sample
(``dis <= 2 (sum(b) - max(b)) <= 2 ib``) and averages, so it holds for every sample, every task and every model:
a fraction below 1.0 means a bug in the belief maths, not a bad model.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from units_lightning.callbacks._shared import step_values

__all__ = ["TheoremOneMonitor", "theorem_one_margin"]


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


class TheoremOneMonitor(Callback):
    """Log the fraction of tasks where Theorem 1 holds (``ib_t >= cb_t / 2``) and its smallest slack, per epoch.

    Training tasks are the labeled (chosen) query sets of each step; validation and test tasks are the
    evaluation tasks. Logged once per epoch through ``LightningModule.log``, so with any logger:
    ``<stage>/theorem1_holds`` (fraction, must be 1.0) and ``<stage>/theorem1_margin`` (min over tasks of
    ``ib_t - cb_t / 2``) for ``stage`` in ``train``, ``val``, ``test``. Under data-parallel training the counts
    are summed and the margin minimised over ranks, so every rank logs the global value.

    The per-epoch belief means themselves (the paper's Figure 3) are logged by ``UnitsMAML``
    (``train/<belief>_epoch``, ``val/<belief>``); this callback adds what needs every task.

    Args:
        atol: rounding slack: a task counts as holding when ``ib_t >= cb_t / 2 - atol`` (the bound is tight for
            two equal beliefs, where float rounding can land either side).
    """

    def __init__(self, atol: float = 1e-6):
        if atol < 0:
            raise ValueError(f"atol must be >= 0, got {atol}")
        self.atol = atol
        self._holds: dict[str, float] = {}
        self._tasks: dict[str, float] = {}
        self._margin: dict[str, float] = {}

    # --- accumulation ---------------------------------------------------------------------------------

    def _reset(self, stage: str) -> None:
        self._holds[stage], self._tasks[stage], self._margin[stage] = 0.0, 0.0, float("inf")

    def _update(self, stage: str, outputs: Any) -> None:
        values = step_values(outputs, ("incorrect_belief", "dissonance"), type(self).__name__)
        margin = theorem_one_margin(values["incorrect_belief"].detach(), values["dissonance"].detach()).double()
        if margin.numel() == 0:
            return
        self._holds[stage] += float((margin >= -self.atol).sum())
        self._tasks[stage] += margin.numel()
        self._margin[stage] = min(self._margin[stage], float(margin.min()))

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage not in self._tasks:
            return
        device = pl_module.device
        counts = trainer.strategy.reduce(
            torch.tensor([self._holds[stage], self._tasks[stage]], dtype=torch.float64, device=device),
            reduce_op="sum",
        )
        margin = trainer.strategy.reduce(
            torch.tensor(self._margin[stage], dtype=torch.float64, device=device), reduce_op="min"
        )
        holds, tasks = (float(c) for c in counts)
        if tasks == 0:
            return
        pl_module.log_dict(
            {f"{stage}/theorem1_holds": holds / tasks, f"{stage}/theorem1_margin": float(margin)},
            on_step=False,
            on_epoch=True,
        )

    # --- hooks ----------------------------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset("train")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._update("train", outputs)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, pl_module, "train")

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset("val")

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._update("val", outputs)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset("test")

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update("test", outputs)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, pl_module, "test")

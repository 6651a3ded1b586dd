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

from units_lightning import keys
from units_lightning.callbacks._epoch_accumulator import EpochAccumulator
from units_lightning.callbacks._shared import step_values
from units_lightning.collectives import log_equal_on_every_rank
from units_lightning.metrics.theorem_one import TheoremOneCheck

__all__ = ["TheoremOneMonitor"]

_HELD_STEPS = 100
"""Training steps whose beliefs are held before they go into the check at once: one update of a hundred steps' tasks
instead of a hundred updates (a dozen small kernels and the metric's Python each, 0.35 ms of the host's time a step
of ``budget_omniglot_5w1s`` on an H200, where the host bounds the compiled step)."""


class TheoremOneMonitor(EpochAccumulator):
    """Log the fraction of tasks where Theorem 1 holds (``ib_t >= cb_t / 2``) and its smallest slack, per epoch.

    Training tasks are the labeled (chosen) query sets of each step; validation and test tasks are the
    evaluation tasks. Logged once per epoch through ``LightningModule.log``, so with any logger:
    ``<stage>/theorem1_holds`` (fraction, must be 1.0) and ``<stage>/theorem1_margin`` (min over tasks of
    ``ib_t - cb_t / 2``) for ``stage`` in ``train``, ``val``, ``test``. Each stage accumulates in a
    ``units_lightning.metrics.TheoremOneCheck`` on the module's device: under data-parallel training the counts
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
        self._checks = {stage: TheoremOneCheck(atol) for stage in keys.STAGES}
        self._held: list[tuple[Any, Any]] = []  # training steps' (incorrect belief, dissonance), not yet checked

    def start(self, pl_module: pl.LightningModule, stage: str) -> None:
        self._checks[stage] = self._checks[stage].to(pl_module.device)  # where the ranks reduce (NCCL: the GPU)
        self._checks[stage].reset()
        if stage == keys.TRAIN:
            self._held = []

    def update(self, stage: str, outputs: Any) -> None:
        values = step_values(outputs, ("incorrect_belief", "dissonance"), type(self).__name__)
        if stage != keys.TRAIN:
            self._checks[stage].update(values["incorrect_belief"], values["dissonance"])
            return
        # A training step's beliefs are its own tensors (copied out of a replayed graph), so they can wait.
        self._held.append((values["incorrect_belief"].detach(), values["dissonance"].detach()))
        if len(self._held) >= _HELD_STEPS:
            self._check_held()

    def _check_held(self) -> None:
        """Put the held steps' tasks into the training check: as one batch where their queries per task agree."""
        held, self._held = self._held, []
        if not held:
            return
        if len({ib.shape[1:] for ib, _ in held}) == 1:
            held = [(torch.cat([ib for ib, _ in held]), torch.cat([dis for _, dis in held]))]
        for incorrect, dissonance in held:
            self._checks[keys.TRAIN].update(incorrect, dissonance)

    def finish(self, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == keys.TRAIN:
            self._check_held()
        if not self._checks[stage].update_called:  # an epoch with no batch: a run resumed at an epoch's end
            return  # every rank alike (each runs the same batches), so no rank waits in compute's reduction
        holds, margin = self._checks[stage].compute()  # every rank: the states are reduced across them
        self._checks[stage].reset()
        if torch.isnan(holds):  # no task on any rank
            return
        log_equal_on_every_rank(  # the checks' states are reduced across ranks
            pl_module,
            {keys.theorem1_holds(stage): float(holds), keys.theorem1_margin(stage): float(margin)},
            on_step=False,
            on_epoch=True,
        )

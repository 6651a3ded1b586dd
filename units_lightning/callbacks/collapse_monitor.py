"""``CollapseMonitor``: warn when training sits at chance with its evidence saturated (or gone), and say which
option gets it out (``collapse_diagnosis``)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor

from units_lightning.callbacks._shared import step_values
from units_lightning.losses import EvidentialLoss

__all__ = ["CollapseMonitor", "TrainingCollapseWarning", "collapse_diagnosis"]


class TrainingCollapseWarning(UserWarning):
    """Training accuracy stayed at chance while vacuity stayed near 0 or 1 (``CollapseMonitor``)."""


def collapse_diagnosis(frozen: bool, loss: Any, eta: float, n_way: int) -> str:
    """What a collapsed run should change, from the state it collapsed into and the loss it trains with.

    ``frozen`` (vacuity near 1 at chance) is the zero-evidence learning freeze of Pandey & Yu (ICML 2023): queries
    without evidence get no gradient (ReLU evidence) or a vanishing one (softplus), so the run does not leave it by
    itself. The remedies named are those of ``EvidentialLoss`` that the run does not use yet: the vacuity
    regulariser (``vacuity_weight``), a smaller eta, the "mean" reduction of the incorrect-belief term (eta's
    weight divided by ``n_way``) and softplus instead of ReLU evidence. Otherwise (evidence saturated at chance)
    the learning rates are named, after the vacuity regulariser when the run uses it: its pull on the true class's
    logit (its vacuity, ``N / S``) outlasts the incorrect-belief term's push (``1 / S**2``) as the evidence of
    every class grows together, and at weight 1.0 it saturated every CIFAR-FS screening run by step 500
    (docs/RESULTS.md, the CIFAR-FS 5w5s investigation).

    Args:
        frozen: vacuity near 1 (True) or near 0 (False).
        loss: the model's loss (``UnitsMAML.loss``); options of an ``EvidentialLoss`` are read, any other gets the
            generic remedies.
        eta: the eta of the collapsed steps.
        n_way: classes per task.

    Returns:
        One sentence: the state, then the options that fix it, each with its current value.

    Example:
        >>> text = collapse_diagnosis(True, EvidentialLoss(), 2.0, 5)  # softplus: its activation is not named
        >>> [option in text for option in ("vacuity_weight, now 0", "ib_reduction, now 'sum'", "activation")]
        [True, True, False]
    """
    if not frozen:
        rates = "lower model.lr (the outer Adam rate) or model.inner_lr (the inner loop's)"
        weight = loss.vacuity_weight if isinstance(loss, EvidentialLoss) else 0.0
        if weight > 0:
            return (
                "evidence saturated (every query claims certainty) under the vacuity regulariser: its pull on the "
                "true class's logit outlasts the incorrect-belief term's push once every class gathers evidence; "
                f"lower model.loss.vacuity_weight (now {weight:g}) or set it to 0 (at 1.0 it saturated every "
                f"CIFAR-FS screening run, docs/RESULTS.md); if the run saturates without it, {rates}"
            )
        return f"the meta-update diverged (every query claims certainty): {rates}"
    remedies = []
    if isinstance(loss, EvidentialLoss):
        weight = loss.vacuity_weight
        remedies.append(
            "the vacuity regulariser, which gives zero-evidence queries a gradient towards their label "
            "(model.loss.vacuity_weight, now 0; start small: 0.01 kept mini-ImageNet 5w1s learning where every run "
            "without it froze, 0.1 left it no vacuity, and 1.0, the authors' value, saturated the evidence of every "
            "CIFAR-FS screening run at chance)"
            if weight == 0
            else f"a larger vacuity regulariser weight (model.loss.vacuity_weight, now {weight:g})"
        )
    remedies.append(f"a smaller eta (model.eta, {eta:.3g} at these steps; lower its peak)")
    if isinstance(loss, EvidentialLoss):
        if loss.ib_reduction == "sum":
            remedies.append(
                f"the 'mean' reduction of the incorrect-belief term (model.loss.ib_reduction, now 'sum'; 'mean' "
                f"divides eta's weight by n_way = {n_way}, as the authors' code)"
            )
        if loss.activation == "relu":
            remedies.append(
                "softplus evidence (model.loss.activation, now 'relu', whose evidence has no gradient at negative "
                "logits)"
            )
    return (
        "zero-evidence learning freeze (Pandey & Yu, ICML 2023: queries without evidence get no gradient, so "
        "training does not leave it by itself); options that fix it: " + "; ".join(remedies)
    )


def window_sums(steps: list[tuple[Tensor, Tensor]]) -> Tensor:
    """(correct queries, vacuity sum, queries) over the steps whose sums are finite, from each step's (correct,
    vacuity) of its queries; a (3,) float tensor on their device. One batch of kernels where the steps' shapes agree
    (every step but a label budget's trimmed last one), else one per step."""
    if len({correct.shape for correct, _ in steps}) == 1:
        correct = torch.stack([c for c, _ in steps]).flatten(1).float()
        vacuity = torch.stack([v for _, v in steps]).flatten(1).float()
        sums = torch.stack([correct.sum(1), vacuity.sum(1), vacuity.new_full((len(steps),), vacuity.shape[1])], 1)
    else:
        sums = torch.stack(  # new_full: a fill on the device, no copy from the host
            [
                torch.stack([c.sum().float(), v.float().sum(), v.new_full((), v.numel(), dtype=torch.float)])
                for c, v in steps
            ]
        )
    return torch.where(sums.isfinite().all(1, keepdim=True), sums, 0.0).sum(0)


class CollapseMonitor(Callback):
    """Warn once when training looks collapsed: over ``window`` consecutive training steps the labeled queries
    are classified at chance (within ``chance_margin`` of ``1 / n_way``) while their mean vacuity stays near 0
    (within ``vacuity_margin``: evidence saturated, every query claims certainty) or near 1 (no evidence at all).

    Both states keep a finite loss, so nothing else stops them. Saturated evidence is a diverged meta-update: the
    quick start with ``model.lr`` 1e6 trains 300 steps to 19.8% (chance 20%) with vacuity 0.0000. No evidence is
    the zero-evidence learning freeze (Pandey & Yu, ICML 2023; ``EvidentialLoss``): too strong an incorrect-belief
    term (eta) drives every logit down until no query has evidence left to learn from. The warning
    (``TrainingCollapseWarning``) names the window's steps, the accuracy and vacuity, and the diagnosis
    (``collapse_diagnosis``): for a freeze, the options of the model's ``EvidentialLoss`` that get out of it (the
    vacuity regulariser, a smaller eta, the "mean" reduction, softplus evidence) with their current values; for
    saturation, the vacuity regulariser's weight when it is on, and the learning rates. The diagnosis is kept in
    ``diagnosis`` for the fit summary and printed again when the fit ends, after the progress output that may have
    buried the warning.

    Reads ``correct``, ``vacuity`` and ``eta`` of ``UnitsMAML``'s training step outputs (``TrainStepOutput``), holds
    each step's until the window is full and sums them there on their device (``window_sums``): one reduction and
    one read per window, nothing per step. Steps whose values are not finite (skipped steps) are left out of the
    sums. Under data-parallel training each rank sums its own queries and rank 0 warns. The ``units-lightning``
    command adds one to every run (``--collapse.window``, ``--collapse.chance_margin``, ``--collapse.vacuity_margin``);
    from Python add it to the trainer's callbacks.

    Args:
        window: consecutive training steps the collapse must last before the warning (0: never check).
        chance_margin: accuracy within this of chance (absolute) counts as chance.
        vacuity_margin: mean vacuity below this, or above ``1 - vacuity_margin``, counts as saturated / empty.
        n_way: classes per task, for chance; None reads the model's ``n_way``.

    Attributes:
        warning: the message, once warned (the fit summary repeats it); None before.
        step: the last step of the window that warned (the fit summary's ``collapse_step``); None before.
        diagnosis: the options that fix the collapse (``collapse_diagnosis``), once warned; None before. The fit
            summary reads it from the trainer's ``CollapseMonitor``.
    """

    def __init__(
        self, window: int = 100, chance_margin: float = 0.05, vacuity_margin: float = 0.01, n_way: int | None = None
    ):
        if window < 0:
            raise ValueError(f"collapse window must be >= 0 steps (0 switches the check off), got {window}")
        if not 0.0 <= chance_margin <= 1.0:
            raise ValueError(f"chance_margin must be an accuracy margin in [0, 1], got {chance_margin}")
        if not 0.0 <= vacuity_margin < 0.5:
            raise ValueError(f"vacuity_margin must be in [0, 0.5), got {vacuity_margin}")
        if n_way is not None and n_way < 2:
            raise ValueError(f"n_way must be >= 2, got {n_way}")
        self.window, self.chance_margin, self.vacuity_margin, self.n_way = window, chance_margin, vacuity_margin, n_way
        self.warning: str | None = None
        self.diagnosis: str | None = None
        self.step: int | None = None
        self._held: list[tuple[Tensor, Tensor]] = []  # the window's steps so far: (correct, vacuity) of their queries
        self._first_step = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.warning, self.diagnosis, self.step, self._held = None, None, None, []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.window == 0 or self.warning is not None:
            return
        values = step_values(outputs, ("correct", "vacuity", "eta"), type(self).__name__)
        if not self._held:
            self._first_step = trainer.global_step - 1
        # Held, not summed, until the window is full: one reduction a window instead of a dozen kernels a step.
        self._held.append((values["correct"].detach(), values["vacuity"].detach()))
        if len(self._held) < self.window:
            return
        held, self._held = self._held, []
        right, vacuity_sum, queries = window_sums(held).tolist()  # one read per window
        if queries == 0:  # every step of the window was non-finite: counted as skipped steps instead
            return
        n_way = self.n_way if self.n_way is not None else getattr(pl_module, "n_way", None)
        if n_way is None:
            raise TypeError("CollapseMonitor needs the classes per task: CollapseMonitor(n_way=...) or a model.n_way")
        accuracy, mean_vacuity, chance = right / queries, vacuity_sum / queries, 1.0 / n_way
        saturated = mean_vacuity <= self.vacuity_margin
        if abs(accuracy - chance) > self.chance_margin or not (saturated or mean_vacuity >= 1 - self.vacuity_margin):
            return
        last = trainer.global_step - 1
        state = (
            "evidence saturated: every query claims certainty" if saturated else "no evidence: every query is vacuous"
        )
        eta = float(values["eta"])
        self.diagnosis = collapse_diagnosis(not saturated, getattr(pl_module, "loss", None), eta, n_way)
        self.step = last
        self.warning = (
            f"training looks collapsed at step {last}: over the {self.window} steps {self._first_step}-{last} the "
            f"labeled queries were classified at {accuracy:.2%} (chance {chance:.2%}) with mean vacuity "
            f"{mean_vacuity:.4f} ({state}). Diagnosis: {self.diagnosis}. Change it and train again; "
            f"collapse.window (now {self.window}) sets how many steps this check waits"
        )
        rank_zero_warn(self.warning, category=TrainingCollapseWarning)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.diagnosis is not None:
            rank_zero_info(f"CollapseMonitor: training collapsed; {self.diagnosis}")

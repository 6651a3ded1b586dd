"""Per-task losses: the evidential (Dirichlet-multinomial) loss of Units-ML and plain cross-entropy.

A loss object maps logits to evidence (``evidence``) and scores a labeled set (``__call__``). The
inner loop and the outer loop use the same object; ``eta`` is passed per call because it follows a
schedule. ``ScheduledInnerLoss`` binds a loss to the current eta for the engines' inner loop.
``EvidentialLoss`` makes the paper's choices explicit options (the evidence activation, the reduction of the
incorrect-belief term) and adds the vacuity regulariser of Pandey & Yu (ICML 2023) against the zero-evidence
learning freeze, off by default.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from units_lightning.belief import belief, incorrect_belief, vacuity

__all__ = [
    "EXP_EVIDENCE_MAX_LOGIT",
    "CrossEntropyLoss",
    "EvidenceActivation",
    "EvidentialLoss",
    "IncorrectBeliefReduction",
    "MetaLoss",
    "ScheduledInnerLoss",
    "class_balanced_copy",
    "class_balanced_mean",
    "vacuity_regulariser",
]


class MetaLoss:
    """Interface of a per-task loss. Subclasses implement ``evidence`` and ``__call__``.

    Attributes:
        uses_eta: False when ``__call__`` ignores ``eta`` (the dashboards then leave its schedule out).
    """

    uses_eta: bool = True

    def evidence(self, logits: Tensor) -> Tensor:
        """Non-negative evidence (..., N) for the belief maths."""
        raise NotImplementedError

    def __call__(self, logits: Tensor, labels: Tensor, eta: float | Tensor = 0.0) -> Tensor:
        """Mean loss over all samples: logits (..., N), labels (...) class indices."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


EvidenceActivation = Literal["softplus", "relu", "exp"]
IncorrectBeliefReduction = Literal["sum", "mean"]
EXP_EVIDENCE_MAX_LOGIT = 60.0
"""Logits are clamped at this before ``exp`` evidence: ``exp(60) * N`` stays finite in float32 for any practical N
and no trained logit reaches it, so values stay finite without cutting gradients in practice. There is no lower
clamp: the authors' code clamps at -10 too, which gives logits below it zero gradient, a zero-evidence region
of its own."""


def class_balanced_mean(values: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """The mean of per-sample ``values`` in which every class present in a task weighs the same, however many of
    the task's samples it has.

    The last dimension holds one task's samples, leading dimensions are tasks; a sample of a class with ``c``
    samples, in a task with ``p`` classes present, weighs ``1 / (p c)``, and the tasks' results are averaged. With
    the same number of samples of every class (any meta-training episode) the weights are ``1 / S``: the plain
    mean. With a support grown by labeled images of whatever classes they turned out to be (the rounds of
    ``benchmarks/labeling_time.py``) it keeps a class with many new labels from outweighing the others in the inner
    loop; the same holds for query sets that people labeled, in the outer loop.

    Args:
        values: (..., S) one value per sample; labels: (..., S) class indices in ``[0, num_classes)``.

    Example:
        >>> values, labels = torch.tensor([1.0, 1.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 1])
        >>> float(class_balanced_mean(values, labels, 2)), float(values.mean())  # (1 + 4) / 2, 7 / 4
        (2.5, 1.75)
    """
    classes = torch.arange(num_classes, device=labels.device)
    one_hot = (labels.unsqueeze(-1) == classes).to(values.dtype)  # (..., S, N): comparisons vectorise under vmap
    counts = one_hot.sum(-2, keepdim=True)  # (..., 1, N)
    present = (counts > 0).to(values.dtype).sum(-1)  # (..., 1)
    weights = 1.0 / ((one_hot * counts).sum(-1) * present)  # (..., S)
    return (values * weights).sum(-1).mean()


def _mean(values: Tensor, labels: Tensor, num_classes: int, class_balanced: bool) -> Tensor:
    return class_balanced_mean(values, labels, num_classes) if class_balanced else values.mean()


def class_balanced_copy(loss: MetaLoss) -> MetaLoss:
    """``loss`` with every class of a task weighing the same (its ``class_balanced`` on), as a copy that leaves
    ``loss`` as it is; ``loss`` itself where it is already so or has no such option.

    Example:
        >>> plain = EvidentialLoss()
        >>> balanced = class_balanced_copy(plain)
        >>> balanced.class_balanced, plain.class_balanced
        (True, False)
    """
    if getattr(loss, "class_balanced", True):
        return loss
    balanced = copy.copy(loss)
    balanced.class_balanced = True
    return balanced


def vacuity_regulariser(logits: Tensor, labels: Tensor, evidence: Tensor) -> Tensor:
    """Per-sample vacuity-weighted correct-evidence regulariser ``-u * o_y`` (Pandey & Yu, ICML 2023).

    ``o_y`` is the logit of the true class and ``u = N / S`` the sample's vacuity, held constant (no gradient
    flows through it). The gradient on ``o_y`` is ``-u``, whatever the evidence activation: largest (-1) for a
    sample with no evidence at all, where the marginal likelihood and the incorrect-belief term give none
    under ReLU evidence (the "zero-evidence region" of the paper, where learning freezes), and vanishing as
    the sample gathers evidence. It is written on the logit for every activation, as the authors' code
    computes it (``use_vac_reg`` in pandeydeep9/EvidentialResearch2023); under ``exp`` evidence
    ``o_y = log e_y``, the log of the correct evidence. Bounded below: ``u * o_y <= N`` for ReLU and softplus evidence
    (``o_y <= e_y <= S``), and it tends to 0 under ``exp``.

    Args:
        logits: (..., N) raw outputs.
        labels: (...) class indices in ``[0, N)``.
        evidence: (..., N) the evidence of ``logits`` (only its vacuity is read, detached).

    Returns:
        (...) the regulariser of each sample.

    Example:
        >>> logits = torch.tensor([[-3.0, -1.0], [4.0, 0.0]])
        >>> vacuity_regulariser(logits, torch.tensor([1, 0]), torch.relu(logits))  # u = 1, then u = 2/6
        tensor([ 1.0000, -1.3333])
    """
    correct_logit = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -vacuity(evidence.detach()) * correct_logit


class EvidentialLoss(MetaLoss):
    """Negative log marginal likelihood of a Dirichlet-multinomial plus ``eta`` times incorrect belief, and
    optionally the vacuity regulariser that keeps zero-evidence samples learning.

    Per sample, with evidence ``e = activation(logits)``, ``alpha = e + 1`` and ``S = sum(alpha)``:
    ``L = log S - log alpha_y + eta * R_ib + vacuity_weight * R_vac`` where

    * ``log S - log alpha_y`` is the marginal likelihood term (paper Eqs. 9-11);
    * ``R_ib = sum_{n != y} b_n`` (``ib_reduction="sum"``, as the paper writes it) or that sum divided by N
      (``"mean"``, what the authors' released and later code computes). ``eta`` is in the units of the
      reduction: the same loss takes N times the eta under "mean" (``eta_mean = eta_sum * N``), so the paper's
      appendix eta 2 with "sum" on 5-way tasks is eta 10 with "mean", 33 times the authors' CIFAR-FS 0.3;
    * ``R_vac = -u * o_y`` (``vacuity_regulariser``; Pandey & Yu, "Learn to Accumulate Evidence from All Training
      Samples: Theory and Practice", ICML 2023): gives gradient to samples whose evidence is zero. It is off by
      default (``vacuity_weight=0``), so the defaults are the paper's loss.

    Each term is a mean over a task's samples; ``class_balanced=True`` makes it ``class_balanced_mean`` (every class
    of the task weighs the same), which equals the plain mean on episodes with as many samples of every class and
    matters where labeled sets are unbalanced (supports grown by labeling, query sets people labeled).

    Without the vacuity term, a strong incorrect-belief penalty can drive every logit negative: under ReLU
    evidence those samples get exactly zero gradient (vacuity 1, accuracy at chance, and no way back: the
    "zero-evidence learning freeze"), under softplus a vanishing one. ``CollapseMonitor`` reports that state
    and names the options here that leave it. The vacuity term has the opposite failure: its pull on ``o_y`` (the
    vacuity, ``N / S``) outlasts the incorrect-belief term's push on the other classes (``~ 1 / S**2``) once every
    class gathers evidence, so a weight too large raises all the evidence until nothing is told apart. At weight
    1.0 (the authors' classifier code) every CIFAR-FS 5w1s and 5w5s screening run, at eta 0.3 and at eta 2, was
    saturated at chance by step 500 (validation vacuity 0.007-0.011; docs/RESULTS.md): keep it off unless a run
    freezes, and then start small. On mini-ImageNet 5w1s, where every run without it froze, 0.1 left no vacuity
    (0.003) and 0.01 was still learning at step 6,000, so ``miniimagenet_5w1s.yaml`` ships 0.01.

    The evidence activation is an option of the loss, not of the backbone: the backbone returns logits and
    every reader of evidence (the module's beliefs and task scores, evaluation and ensembles) calls
    ``loss.evidence``, so one choice here holds everywhere. ``L`` is finite for logits of any finite size.

    Args:
        ib_reduction: "sum" (paper) or "mean" (authors' code) over classes for the incorrect-belief term.
        activation: evidence function: "softplus" (the paper's Units-ML), "relu" (the original evidential
            networks, and the activation whose zero-evidence region Pandey & Yu 2023 analyse) or "exp"
            (``exp`` of the logits clamped at ``EXP_EVIDENCE_MAX_LOGIT``).
        vacuity_weight: weight of ``R_vac``, >= 0 (0: off, the paper's loss). It applies in the inner loop and
            the outer loop alike, as the loss object does.
        class_balanced: average each term with every class of a task weighing the same (``class_balanced_mean``)
            instead of every sample; off: the paper's mean.

    Example:
        >>> loss = EvidentialLoss()
        >>> logits = torch.tensor([[50.0, -50.0]])
        >>> round(float(loss(logits, torch.tensor([0]))), 4)  # log(52) - log(51)
        0.0194
        >>> frozen = torch.tensor([[-2.0, -3.0]], requires_grad=True)  # ReLU evidence 0: nothing to learn from
        >>> EvidentialLoss(activation="relu", vacuity_weight=1.0)(frozen, torch.tensor([0]), eta=2.0).backward()
        >>> frozen.grad  # without the vacuity term: zeros
        tensor([[-1.,  0.]])
    """

    def __init__(
        self,
        ib_reduction: IncorrectBeliefReduction = "sum",
        activation: EvidenceActivation = "softplus",
        vacuity_weight: float = 0.0,
        class_balanced: bool = False,
    ):
        if ib_reduction not in ("sum", "mean"):
            raise ValueError(f"ib_reduction must be 'sum' or 'mean', got {ib_reduction!r}")
        if activation not in ("softplus", "relu", "exp"):
            raise ValueError(f"activation must be 'softplus', 'relu' or 'exp', got {activation!r}")
        if not vacuity_weight >= 0 or vacuity_weight == float("inf"):
            raise ValueError(f"vacuity_weight must be a finite weight >= 0 (0 switches it off), got {vacuity_weight}")
        self.ib_reduction = ib_reduction
        self.activation = activation
        self.vacuity_weight = vacuity_weight
        self.class_balanced = class_balanced

    def evidence(self, logits: Tensor) -> Tensor:
        if self.activation == "softplus":
            return F.softplus(logits)
        if self.activation == "relu":
            return F.relu(logits)
        return torch.exp(logits.clamp(max=EXP_EVIDENCE_MAX_LOGIT))

    def __call__(self, logits: Tensor, labels: Tensor, eta: float | Tensor = 0.0) -> Tensor:
        evidence = self.evidence(logits)
        labels = labels.long()
        strength = evidence.sum(dim=-1) + evidence.shape[-1]
        nll = torch.log(strength) - torch.log1p(evidence.gather(-1, labels.unsqueeze(-1)).squeeze(-1))
        classes = evidence.shape[-1]
        loss = _mean(nll, labels, classes, self.class_balanced)
        if isinstance(eta, Tensor) or eta != 0:  # a tensor eta keeps compiled graphs free of its value
            regulariser = incorrect_belief(belief(evidence), labels)
            if self.ib_reduction == "mean":
                regulariser = regulariser / evidence.shape[-1]
            loss = loss + eta * _mean(regulariser, labels, classes, self.class_balanced)
        if self.vacuity_weight != 0:  # off: not computed, so the default loss is the paper's, op for op
            regulariser = vacuity_regulariser(logits, labels, evidence)
            loss = loss + self.vacuity_weight * _mean(regulariser, labels, classes, self.class_balanced)
        return loss


class CrossEntropyLoss(MetaLoss):
    """Softmax cross-entropy: with the random sampler this is plain MAML.

    ``class_balanced=True``: every class of a task weighs the same in the mean (``class_balanced_mean``).

    Beliefs for logging come from ``exp(logits)`` as evidence (clamped at ``EXP_EVIDENCE_MAX_LOGIT``), the
    Dirichlet whose expected probability is the softmax up to the +1 prior.
    """

    uses_eta = False

    def __init__(self, class_balanced: bool = False):
        self.class_balanced = class_balanced

    def evidence(self, logits: Tensor) -> Tensor:
        return torch.exp(logits.clamp(max=EXP_EVIDENCE_MAX_LOGIT))

    def __call__(self, logits: Tensor, labels: Tensor, eta: float | Tensor = 0.0) -> Tensor:
        labels, classes = labels.long(), logits.shape[-1]
        if not self.class_balanced:
            return F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1))
        per_sample = F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1), reduction="none")
        return class_balanced_mean(per_sample.view(labels.shape), labels, classes)


class ScheduledInnerLoss(nn.Module):
    """``loss(logits, labels)`` of the inner loop: a ``MetaLoss`` with eta held in a buffer.

    The engines call the inner loss with logits and labels only. Eta follows a schedule, so it is set once per
    step with ``set_eta``, which writes into the same storage every time: an inner loop captured as a CUDA
    graph or compiled reads each step's value without being rebuilt. The buffer is not saved in checkpoints.

    Args:
        loss: the per-task loss.

    Example:
        >>> inner = ScheduledInnerLoss(EvidentialLoss())
        >>> inner.set_eta(0.5)
        >>> logits, labels = torch.tensor([[2.0, -1.0]]), torch.tensor([1])
        >>> bool(inner(logits, labels) == EvidentialLoss()(logits, labels, torch.tensor(0.5)))
        True
    """

    def __init__(self, loss: MetaLoss):
        super().__init__()
        self.loss = loss
        self.register_buffer("eta", torch.zeros(()), persistent=False)

    def set_eta(self, value: float) -> None:
        """The eta of the following inner loops (written in place)."""
        self.eta.fill_(value)

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return self.loss(logits, labels, self.eta.to(logits.dtype))

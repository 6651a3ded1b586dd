"""Per-task losses: the evidential (Dirichlet-multinomial) loss of Units-ML and plain cross-entropy.

A loss object maps logits to evidence (``evidence``) and scores a labeled set (``__call__``). The
inner loop and the outer loop use the same object; ``eta`` is passed per call because it follows a
schedule. ``ScheduledInnerLoss`` binds a loss to the current eta for the engines' inner loop.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from units_lightning.belief import belief, incorrect_belief

__all__ = ["CrossEntropyLoss", "EvidentialLoss", "MetaLoss", "ScheduledInnerLoss"]


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


class EvidentialLoss(MetaLoss):
    """Negative log marginal likelihood of a Dirichlet-multinomial plus ``eta`` times incorrect belief.

    Per sample, with ``e = softplus(logits)``, ``alpha = e + 1`` and ``S = sum(alpha)``:
    ``L = log S - log alpha_y + eta * R_ib`` (paper Eqs. 9-11), where ``R_ib = sum_{n != y} b_n``
    (``ib_reduction="sum"``, as the paper writes it) or that sum divided by N (``"mean"``, what the
    authors' released code computes). ``L`` is finite for logits of any finite size.

    Args:
        ib_reduction: "sum" (paper) or "mean" (released code) over classes for the regulariser.
        activation: evidence function, "softplus" (paper), "relu" or "exp" (clamped at 60).

    Example:
        >>> loss = EvidentialLoss()
        >>> logits = torch.tensor([[50.0, -50.0]])
        >>> round(float(loss(logits, torch.tensor([0]))), 4)  # log(52) - log(51)
        0.0194
    """

    def __init__(
        self,
        ib_reduction: Literal["sum", "mean"] = "sum",
        activation: Literal["softplus", "relu", "exp"] = "softplus",
    ):
        if ib_reduction not in ("sum", "mean"):
            raise ValueError(f"ib_reduction must be 'sum' or 'mean', got {ib_reduction!r}")
        if activation not in ("softplus", "relu", "exp"):
            raise ValueError(f"activation must be 'softplus', 'relu' or 'exp', got {activation!r}")
        self.ib_reduction = ib_reduction
        self.activation = activation

    def evidence(self, logits: Tensor) -> Tensor:
        if self.activation == "softplus":
            return F.softplus(logits)
        if self.activation == "relu":
            return F.relu(logits)
        return torch.exp(logits.clamp(max=60.0))

    def __call__(self, logits: Tensor, labels: Tensor, eta: float | Tensor = 0.0) -> Tensor:
        evidence = self.evidence(logits)
        labels = labels.long()
        strength = evidence.sum(dim=-1) + evidence.shape[-1]
        nll = torch.log(strength) - torch.log1p(evidence.gather(-1, labels.unsqueeze(-1)).squeeze(-1))
        loss = nll.mean()
        if isinstance(eta, Tensor) or eta != 0:  # a tensor eta keeps compiled graphs free of its value
            regulariser = incorrect_belief(belief(evidence), labels)
            if self.ib_reduction == "mean":
                regulariser = regulariser / evidence.shape[-1]
            loss = loss + eta * regulariser.mean()
        return loss


class CrossEntropyLoss(MetaLoss):
    """Softmax cross-entropy: with the random sampler this is plain MAML.

    Beliefs for logging come from ``exp(logits)`` as evidence (clamped at 60 to stay finite), the
    Dirichlet whose expected probability is the softmax up to the +1 prior.
    """

    uses_eta = False

    def evidence(self, logits: Tensor) -> Tensor:
        return torch.exp(logits.clamp(max=60.0))

    def __call__(self, logits: Tensor, labels: Tensor, eta: float | Tensor = 0.0) -> Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long())


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

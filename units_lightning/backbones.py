"""Backbones: the 4-conv network that MAML, MAML++ and Units-ML share."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["BatchNorm", "ConvNet", "batch_norm", "batch_norm_primitive"]


def _statistics(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per-channel mean and 1 / sqrt(var + eps) over (N, H, W), shaped (1, C, 1, 1)."""
    var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
    return mean, torch.rsqrt(var + eps)


def batch_norm_primitive(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Transductive batch norm from primitive operations, differentiated by autograd: the reference that
    ``batch_norm`` equals (tests), and what it replaced."""
    mean, rstd = _statistics(x, eps)
    # (x - mean) * rstd * weight + bias as x * scale + shift: one statistics pass and one fused multiply-add over
    # the activations instead of four elementwise passes (and less saved for backward).
    scale = rstd * weight.view(1, -1, 1, 1)
    return torch.addcmul(bias.view(1, -1, 1, 1) - mean * scale, x, scale)


class _BatchNormFunction(torch.autograd.Function):
    """``batch_norm_primitive`` with its backward written out.

    Autograd of the forward's primitive operations differentiates the statistics term by term; the closed form
    (dx = rstd * weight * (g - mean(g) - xhat * mean(g * xhat)), dweight = sum(g * xhat), dbias = sum(g)) takes
    fewer operations, and MAML differentiates this backward once more for its meta-gradient, where the saving
    counts again: a second-order training step launches about 11% fewer operations (docs/PERFORMANCE.md). The
    backward recomputes the statistics from the saved input rather than saving them, so that its own gradient
    (the double backward) sees how they depend on x: saved statistics would enter it as constants.
    ``generate_vmap_rule`` lets ``torch.func.vmap`` batch it over tasks as it batches the primitive form.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        return batch_norm_primitive(x, weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 (torch's signature)
        x, weight, _bias, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:  # noqa: ANN001
        x, weight = ctx.saved_tensors
        mean, rstd = _statistics(x, ctx.eps)
        normalised = (x - mean) * rstd
        grad_bias = grad.sum(dim=(0, 2, 3), keepdim=True)
        grad_weight = (grad * normalised).sum(dim=(0, 2, 3), keepdim=True)
        count = x.numel() // x.shape[1]
        grad_x = (rstd * weight.view(1, -1, 1, 1)) * (grad - (grad_bias + normalised * grad_weight) / count)
        return grad_x, grad_weight.view(weight.shape), grad_bias.view(weight.shape), None


def batch_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Transductive batch norm of (N, C, H, W) over (N, H, W): (x - mean) / sqrt(var + eps) * weight + bias, with
    a closed-form backward that is itself differentiable (any order, under ``torch.func`` and ``vmap``)."""
    return _BatchNormFunction.apply(x, weight, bias, eps)


class BatchNorm(nn.Module):
    """Transductive batch norm over (N, H, W), optionally per inner step.

    It always normalises with the statistics of the batch it sees (a support set or one query set) and
    keeps no running statistics, as the authors' code does at training and test time. It is written from
    ``mean`` and ``var`` (``batch_norm``, with a closed-form backward) because ``nn.BatchNorm2d`` under
    ``torch.func.vmap`` gives wrong second-order meta-gradients (REFERENCE §5). With ``steps > 1`` it holds one
    (weight, bias) pair per inner step (MAML++'s per-step batch-norm weights); step ``s`` uses pair
    ``min(s, steps - 1)``.

    Args:
        channels: feature channels.
        steps: number of (weight, bias) pairs.
        eps: added to the variance.
    """

    def __init__(self, channels: int, steps: int = 1, eps: float = 1e-5):
        super().__init__()
        self.steps, self.eps = steps, eps
        shape = (channels,) if steps == 1 else (steps, channels)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: Tensor, step: int = 0) -> Tensor:
        weight, bias = self.weight, self.bias
        if weight.dim() == 2:  # (steps, channels); a caller may pass one step's pair instead (``torch.func``)
            weight, bias = weight[min(step, weight.shape[0] - 1)], bias[min(step, bias.shape[0] - 1)]
        return batch_norm(x, weight, bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[-1]}, steps={self.steps}, eps={self.eps}"


class ConvNet(nn.Module):
    """``blocks`` x [conv 3x3 (pad 1, Xavier) -> batch norm -> leaky ReLU -> max-pool 2] -> linear.

    The forward pass pools before the activation: a non-decreasing activation commutes with max-pooling, so
    the outputs and gradients are exactly those of the order above, on a quarter of the elements.

    Batch norm is transductive (``BatchNorm``), so training, scoring and evaluation behave the same and
    no buffers are shared between adapted copies. With ``bn_steps > 1`` every batch norm holds one
    weight pair per inner step; those are meta-learned only (``meta_only_parameters``), as in MAML++, and listed in
    ``per_step_parameters`` (stacked along a first dimension of steps: the batched engine splits them once a loop).

    Args:
        image_shape: (channels, height, width) of the input images.
        out_features: number of classes (n_way).
        filters: channels of every conv layer (64 for Omniglot and CIFAR-FS, 48 for mini-ImageNet).
        blocks: number of conv blocks.
        bn_steps: batch-norm weight pairs, 1 (shared) or inner steps + 1 (per step, the last for prediction).

    Example:
        >>> net = ConvNet((1, 28, 28), out_features=5, filters=8)
        >>> net(torch.zeros(3, 1, 28, 28)).shape
        torch.Size([3, 5])
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int] = (1, 28, 28),
        out_features: int = 5,
        filters: int = 64,
        blocks: int = 4,
        bn_steps: int = 1,
    ):
        super().__init__()
        channels, height, width = image_shape
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        for block in range(blocks):
            conv = nn.Conv2d(channels if block == 0 else filters, filters, kernel_size=3, padding=1)
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)
            self.convs.append(conv)
            self.norms.append(BatchNorm(filters, steps=bn_steps))
            height, width = height // 2, width // 2
        if height < 1 or width < 1:
            raise ValueError(f"images of shape {tuple(image_shape)} are too small for {blocks} pooling blocks")
        self.activation, self.pool = nn.LeakyReLU(), nn.MaxPool2d(2)
        self.classifier = nn.Linear(filters * height * width, out_features)
        self.meta_only_parameters = frozenset(
            name for name, _ in self.named_parameters() if bn_steps > 1 and name.startswith("norms.")
        )
        self.per_step_parameters = self.meta_only_parameters  # stacked along a first dimension of inner steps

    def forward(self, x: Tensor, step: int = 0) -> Tensor:
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = self.activation(self.pool(norm(conv(x), step)))
        return self.classifier(x.flatten(1))

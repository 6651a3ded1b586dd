"""Backbones: the 4-conv network that MAML, MAML++ and Units-ML share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from units_lightning.conv_grads import conv3x3_explicit_grads

__all__ = ["BatchNorm", "ConvNet", "conv3x3", "conv3x3_batch_norm", "patch_moments"]


def conv3x3(x: Tensor, weight: Tensor, bias: Tensor, as_shifts: bool = False, explicit_grads: bool = False) -> Tensor:
    """A 3x3 convolution with padding 1: ``F.conv2d(x, weight, bias, padding=1)``, or with ``as_shifts`` the same
    as a sum over the kernel's nine taps of the weight times the shifted images, for a single-channel input.

    ``ConvNet`` sums the taps for a single-channel input (Omniglot's first layer) inside a compiled graph. Under
    ``vmap`` over tasks a convolution whose weights differ per task becomes one grouped convolution; with one input
    channel per group PyTorch runs it with its own depthwise kernels, not cuDNN's, which took 12% of a compiled
    Omniglot 20w1s step's GPU time on an H200 (docs/PERFORMANCE.md). As nine multiply-adds, forward and backward are
    elementwise work and reductions, which the compiler fuses with the batch norm that follows: the compiled step was
    1.09x faster in a whole run.

    With ``explicit_grads`` (and not ``as_shifts``) every derivative of the convolution is its own data or weight
    gradient (``conv_grads.conv3x3_explicit_grads``): eagerly, a second-order step's weight term is then one grouped
    weight gradient instead of one image-sized convolution per task.
    """
    if not as_shifts:
        return conv3x3_explicit_grads(x, weight, bias) if explicit_grads else F.conv2d(x, weight, bias, padding=1)
    if x.shape[1] != 1:
        raise ValueError(f"conv3x3 sums shifted taps of single-channel images only, got {x.shape[1]} channels")
    height, width = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1))
    out = bias.view(1, -1, 1, 1)
    for row in range(3):
        for col in range(3):
            out = out + weight[:, :, row, col].view(1, -1, 1, 1) * padded[:, :, row : row + height, col : col + width]
    return out


def patch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """The mean (C*9,) and population covariance (C*9, C*9) of the 3x3 patches (zero padding 1) of ``x`` (N, C, H, W)
    over its N*H*W positions, indexed as ``weight.flatten(1)`` of a 3x3 convolution (channel, row, column).

    In float32 at least, autocast or not: in half precision the covariance's sums overflow (to inf for 160 Omniglot
    images), which would zero the folded weights without an error.

    Not one matrix product over all N*H*W positions: for a 9x9 result that is a single thread block walking the whole
    batch (114 µs a call on an H200, 2.97 ms of a compiled ``omniglot_20w1s`` step, more than the reductions the fold
    saves). Compiled, the products and their mean are one reduction that Inductor fuses with the patches' gather and
    splits over the GPU; eager, one small product per image, summed.

    Eager, the patches are the nine shifted views of the padded images stacked, not ``F.unfold``: on CUDA that is
    ``im2col``, one kernel launch per image (2,400 per evaluation batch of 20 ``omniglot_20w1s`` tasks on an H200,
    8.6 of its 22.9 ms)."""
    dtype, compiling = torch.promote_types(x.dtype, torch.float32), torch.compiler.is_compiling()
    with torch.autocast(x.device.type, enabled=False):
        patches = F.unfold(x.to(dtype), 3, padding=1) if compiling else _patches(x.to(dtype))
        patches = patches.transpose(1, 2)  # (N, H*W, C*9)
        mean = patches.mean((0, 1))
        centered = patches.sub_(mean)  # in place: the patches of large RGB images are a sizeable copy already
        if compiling:
            return mean, (centered[..., :, None] * centered[..., None, :]).mean((0, 1))
        return mean, (centered.transpose(1, 2) @ centered).sum(0) / (centered.shape[0] * centered.shape[1])


def _patches(x: Tensor) -> Tensor:
    """``F.unfold(x, 3, padding=1)`` (N, C*9, H*W) in one stacking kernel: the nine shifts of the zero-padded images."""
    n, c, h, w = x.shape
    padded = F.pad(x, (1, 1, 1, 1))
    shifts = [padded[:, :, i : i + h, j : j + w] for i in range(3) for j in range(3)]
    return torch.stack(shifts, 2).reshape(n, c * 9, h * w)


def conv3x3_batch_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    norm_weight: Tensor,
    norm_bias: Tensor,
    eps: float,
    as_shifts: bool = False,
    explicit_grads: bool = False,
) -> Tensor:
    """``conv3x3`` then ``BatchNorm`` (the batch's statistics over (N, H, W), then ``norm_weight`` and ``norm_bias``),
    as one convolution whose weights fold the statistics in; the same function of every argument, exact to rounding.

    A convolution's output is linear in the image's patches, ``out_c = w_c . p + b_c``, so its batch statistics follow
    from the patches' moments without computing ``out``: ``mean_c = w_c . mean(p) + b_c`` and ``var_c = w_c^T cov(p)
    w_c``. With ``scale = norm_weight / sqrt(var + eps)`` the normalised output is the convolution with weights
    ``scale_c w_c`` and bias ``norm_bias_c + scale_c (b_c - mean_c)``. The moments do not depend on the weights, and the
    statistics as functions of the weights are those batch norm computes, so their gradients and second-order terms are
    too (float64: tests/test_backbones.py, and the meta-gradients in tests/engines/test_engines_agree.py); what changes
    is the work: no reduction over the output and its gradients, only over the patches (C*9 of them: 9 for Omniglot, 27
    for RGB images, against the output's 64 channels) and small products with the weights. Worth it for a first layer,
    whose few input channels make the patches cheap. Eager, the covariance is a product per image, rounded as TF32 where
    those are allowed (``torch.backends.cuda.matmul.allow_tf32``, off by default), as cuDNN's convolutions are.
    """
    mean, cov = patch_moments(x)
    flat = weight.flatten(1)
    # products and sums, not matrix products: a compiler fuses these (and their derivatives) into a few kernels
    var = (flat[:, :, None] * cov * flat[:, None, :]).sum((1, 2))
    scale = norm_weight * torch.rsqrt(var + eps)
    # The bias cancels, as in batch norm, but stays in the graph: the engines' autograd.grad refuses an unused parameter
    shift = norm_bias + scale * (bias - ((flat * mean).sum(1) + bias))
    return conv3x3(x, (flat * scale[:, None]).view_as(weight), shift, as_shifts, explicit_grads)


class BatchNorm(nn.Module):
    """Transductive batch norm over (N, H, W) written from primitive operations, optionally per inner step.

    It always normalises with the statistics of the batch it sees (a support set or one query set) and
    keeps no running statistics, as the authors' code does at training and test time. It is written from
    ``mean`` and ``var`` because ``nn.BatchNorm2d`` under ``torch.func.vmap`` gives wrong second-order
    meta-gradients (REFERENCE §5). With ``steps > 1`` it holds one (weight, bias) pair per inner step
    (MAML++'s per-step batch-norm weights); step ``s`` uses pair ``min(s, steps - 1)``.

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

    def affine(self, step: int = 0) -> tuple[Tensor, Tensor]:
        """The (weight, bias) pair of inner step ``step``, each (channels,)."""
        weight, bias = self.weight, self.bias
        if weight.dim() == 2:  # (steps, channels); a caller may pass one step's pair instead (``torch.func``)
            weight, bias = weight[min(step, weight.shape[0] - 1)], bias[min(step, bias.shape[0] - 1)]
        return weight, bias

    def forward(self, x: Tensor, step: int = 0) -> Tensor:
        weight, bias = self.affine(step)
        # (x - mean) / sqrt(var + eps) * weight + bias as x * scale + shift: one statistics pass and one fused
        # multiply-add over the activations instead of four elementwise passes (and less saved for backward).
        var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
        scale = torch.rsqrt(var + self.eps) * weight.view(1, -1, 1, 1)
        return torch.addcmul(bias.view(1, -1, 1, 1) - mean * scale, x, scale)

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
        fold_first_norm: compute the first block's convolution and batch norm as one convolution with the batch's
            statistics folded into its weights (``conv3x3_batch_norm``): the same outputs and gradients to rounding,
            the same parameters (checkpoints load either way), no batch-norm reductions over the first layer's
            activations.
        explicit_conv_grads: differentiate every convolution through its own data and weight gradients at every order
            (``conv_grads``; in compiled graphs the engine's graph pass): the same outputs and meta-gradients to
            rounding.

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
        fold_first_norm: bool = False,
        explicit_conv_grads: bool = False,
    ):
        super().__init__()
        self.fold_first_norm, self.explicit_conv_grads = fold_first_norm, explicit_conv_grads
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
        explicit = self.explicit_conv_grads
        for block, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            as_shifts = x.shape[1] == 1 and torch.compiler.is_compiling()
            if block == 0 and self.fold_first_norm:
                x = conv3x3_batch_norm(x, conv.weight, conv.bias, *norm.affine(step), norm.eps, as_shifts, explicit)
            else:
                x = norm(conv3x3(x, conv.weight, conv.bias, as_shifts, explicit), step)
            x = self.activation(self.pool(x))
        return self.classifier(x.flatten(1))

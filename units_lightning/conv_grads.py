"""A 3x3 convolution (stride 1, padding 1) whose derivatives of every order are its own data and weight gradients.

Second-order MAML differentiates a convolution's backward pass. PyTorch's formula for that
(``_convolution_double_backward``) takes the weight term, the data gradient's derivative in the weights, as a forward
convolution of the transposed tensors: batch and channels swapped, the image-sized gradient as the kernel (14x14 on
Omniglot's second layer). For a grouped convolution, which ``vmap`` over tasks makes of a per-task one, it runs that
convolution once per group, task by task: 32 of each size in an eager ``omniglot_20w1s`` step, which cuDNN runs as
FFT convolutions on an H200 (docs/PERFORMANCE.md, "The folded first batch norm on the GPU").

Here the convolution, its data gradient (``dgrad``) and its weight gradient (``wgrad``) are three
``torch.autograd.Function``s whose backward passes are made of the same three, so every order of derivative is one of
them: the term above becomes the weight gradient ``wgrad(ggx, gy)``, one grouped call for all tasks. The same
function and derivatives to rounding (float64: tests/test_conv_grads.py). ``vmap`` batches them through their
operations' own rules (``generate_vmap_rule``).

Eager only: ``torch.compile`` cannot trace an ``autograd.Function`` under ``vmap`` (Dynamo's wrapper has no batching
rule), so inside a compiled graph ``conv3x3`` takes ``F.conv2d``, whose double backward AOTAutograd already writes with
weight-gradient calls for grouped convolutions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["conv3x3_explicit_grads"]

_GEOMETRY: dict[str, Any] = {
    "stride": [1, 1],
    "padding": [1, 1],
    "dilation": [1, 1],
    "transposed": False,
    "output_padding": [0, 0],
    "groups": 1,
}


def _dgrad(gy: Tensor, weight: Tensor, x_shape: torch.Size) -> Tensor:
    """The gradient of ``conv(x, weight)`` in ``x`` for the output gradient ``gy``."""
    x = gy.new_empty(x_shape)  # its shape is what the data gradient reads
    return torch.ops.aten.convolution_backward(gy, x, weight, None, output_mask=[True, False, False], **_GEOMETRY)[0]


def _wgrad(x: Tensor, gy: Tensor, weight_shape: torch.Size) -> Tensor:
    """The gradient of ``conv(x, weight)`` in ``weight`` for the output gradient ``gy``."""
    weight = x.new_empty(weight_shape)  # its shape is what the weight gradient reads
    return torch.ops.aten.convolution_backward(gy, x, weight, None, output_mask=[False, True, False], **_GEOMETRY)[1]


class _Conv(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, padding=1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        return (
            _DGrad.apply(gy, weight, x.shape) if need_x else None,
            _WGrad.apply(x, gy, weight.shape) if need_weight else None,
            gy.sum((0, 2, 3)) if need_bias else None,
        )


class _DGrad(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(gy: Tensor, weight: Tensor, x_shape: torch.Size) -> Tensor:
        return _dgrad(gy, weight, x_shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])

    @staticmethod
    def backward(ctx: Any, ggx: Tensor) -> tuple[Tensor | None, ...]:
        gy, weight = ctx.saved_tensors
        need_gy, need_weight, _ = ctx.needs_input_grad
        return (
            _Conv.apply(ggx, weight, None) if need_gy else None,
            _WGrad.apply(ggx, gy, weight.shape) if need_weight else None,
            None,
        )


class _WGrad(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, gy: Tensor, weight_shape: torch.Size) -> Tensor:
        return _wgrad(x, gy, weight_shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])

    @staticmethod
    def backward(ctx: Any, ggw: Tensor) -> tuple[Tensor | None, ...]:
        x, gy = ctx.saved_tensors
        need_x, need_gy, _ = ctx.needs_input_grad
        return (
            _DGrad.apply(gy, ggw, x.shape) if need_x else None,
            _Conv.apply(x, ggw, None) if need_gy else None,
            None,
        )


def conv3x3_explicit_grads(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.conv2d(x, weight, bias, padding=1)`` for 3x3 kernels, differentiated at every order through its own data and
    weight gradients (see the module); inside a compiled graph, ``F.conv2d`` itself."""
    if torch.compiler.is_compiling():
        return F.conv2d(x, weight, bias, padding=1)
    return _Conv.apply(x, weight, bias)

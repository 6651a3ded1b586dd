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

``torch.compile`` cannot trace an ``autograd.Function`` under ``vmap`` (Dynamo's wrapper has no batching rule), so
inside a compiled graph ``conv3x3_explicit_grads`` is ``F.conv2d``, and ``WeightGradientPass``, a pass over
Inductor's post-grad graph, rewrites each image-sized-kernel convolution there as the weight gradient it is. The
engine adds it to its compiled graphs where the backbone asks for ``explicit_conv_grads``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["WeightGradientPass", "conv3x3_explicit_grads", "weight_gradients_for_image_kernels"]

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


class _SavesTwoInputs(torch.autograd.Function):
    """The three Functions' shared part: ``vmap`` batches them through their operations, and each keeps its first two
    inputs for its backward pass."""

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])


class _Conv(_SavesTwoInputs):
    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, padding=1)

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        return (
            _DGrad.apply(gy, weight, x.shape) if need_x else None,
            _WGrad.apply(x, gy, weight.shape) if need_weight else None,
            gy.sum((0, 2, 3)) if need_bias else None,
        )


class _DGrad(_SavesTwoInputs):
    @staticmethod
    def forward(gy: Tensor, weight: Tensor, x_shape: torch.Size) -> Tensor:
        return _dgrad(gy, weight, x_shape)

    @staticmethod
    def backward(ctx: Any, ggx: Tensor) -> tuple[Tensor | None, ...]:
        gy, weight = ctx.saved_tensors
        need_gy, need_weight, _ = ctx.needs_input_grad
        return (
            _Conv.apply(ggx, weight, None) if need_gy else None,
            _WGrad.apply(ggx, gy, weight.shape) if need_weight else None,
            None,
        )


class _WGrad(_SavesTwoInputs):
    @staticmethod
    def forward(x: Tensor, gy: Tensor, weight_shape: torch.Size) -> Tensor:
        return _wgrad(x, gy, weight_shape)

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


def weight_gradients_for_image_kernels(graph: torch.fx.Graph) -> int:
    """Rewrite in ``graph`` (aten operations with their ``val`` metadata) each convolution ``conv(a, b)`` whose kernel
    ``b`` is as large as its image ``a`` and larger than its output (stride 1, padding p, no bias, no groups: a
    (2p+1)x(2p+1) output) as the weight gradient it is: ``out[i, o] = sum_n a[i, n] * b[o, n]`` over positions is,
    transposed, ``wgrad`` of a (2p+1)x(2p+1) convolution whose input is ``a`` with batch and channels swapped and whose
    output gradient is ``b`` swapped the same way. Returns how many it rewrote."""
    aten, rewritten = torch.ops.aten, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        a, b, bias, stride, padding, dilation, transposed, _, groups = node.args
        image, kernel, out = (getattr(n, "meta", {}).get("val") for n in (a, b, node))
        if image is None or kernel is None or out is None or image.dim() != 4 or bias is not None:
            continue
        if transposed or groups != 1 or list(stride) != [1, 1] or list(dilation) != [1, 1]:
            continue
        size = 2 * padding[0] + 1
        if padding[0] != padding[1] or kernel.shape[2:] != image.shape[2:] or tuple(out.shape[2:]) != (size, size):
            continue
        if max(kernel.shape[2:]) <= size:  # a 3x3 image with a 3x3 kernel is an ordinary convolution: left alone
            continue
        with graph.inserting_before(node):
            x = graph.call_function(aten.permute.default, (a, [1, 0, 2, 3]))
            gy = graph.call_function(aten.permute.default, (b, [1, 0, 2, 3]))
            shape = [kernel.shape[0], image.shape[0], size, size]
            weight = graph.call_function(
                aten.empty.memory_format, (shape,), {"dtype": image.dtype, "device": image.device}
            )
            geometry = ([1, 1], list(padding), [1, 1], False, [0, 0], 1, [False, True, False])
            grads = graph.call_function(aten.convolution_backward.default, (gy, x, weight, None, *geometry))
            wgrad = graph.call_function(operator.getitem, (grads, 1))
            result = graph.call_function(aten.permute.default, (wgrad, [1, 0, 2, 3]))
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _weight_gradient_pass_base() -> type:
    try:  # torch >= 2.6: a pass with a uuid keeps Inductor's graph cache on
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:  # pragma: no cover - older torch: a plain callable (the cache is bypassed)
        return object
    return CustomGraphPass


class WeightGradientPass(_weight_gradient_pass_base()):
    """``weight_gradients_for_image_kernels`` as Inductor's ``post_grad_custom_post_pass``, with a uuid of this file,
    so that compiled graphs stay in the compile cache. ``rewritten`` counts the convolutions it rewrote."""

    def __init__(self) -> None:
        self.rewritten = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.rewritten += weight_gradients_for_image_kernels(graph)

    def uuid(self) -> Any:
        from torch._inductor.custom_graph_pass import get_hash_for_files

        return get_hash_for_files((__file__,))

    def __repr__(self) -> str:  # stable across processes: compile_ahead keys its folder on the options' repr
        return f"WeightGradientPass({self.uuid()!r})"

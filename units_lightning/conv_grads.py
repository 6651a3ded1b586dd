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
Inductor's post-grad graph, rewrites each image-sized-kernel convolution there as the weight gradient it is: the
groups of one grouped convolution (the tasks) as one grouped weight gradient, as eagerly. The engine adds it to its
compiled graphs where the backbone asks for ``explicit_conv_grads``.
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
    output gradient is ``b`` swapped the same way. Where such convolutions are the groups of one grouped convolution's
    double backward (``_merge_groups``), all of them become one grouped weight gradient. Returns how many convolutions
    it rewrote."""
    rewritten = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.cat.default:
            rewritten += _merge_groups(graph, node)
    for node in list(graph.nodes):
        padding = _image_kernel_padding(node)
        if padding is None:
            continue
        a, b = node.args[:2]
        with graph.inserting_before(node):
            result = _swapped_weight_gradient(graph, a, b, padding, groups=1)
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _image_kernel_padding(node: torch.fx.Node) -> list[int] | None:
    """The padding of ``node`` where it is a convolution with an image-sized kernel (see
    ``weight_gradients_for_image_kernels``), else None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.convolution.default:
        return None
    a, b, bias, stride, padding, dilation, transposed, _, groups = node.args
    image, kernel, out = (getattr(n, "meta", {}).get("val") for n in (a, b, node))
    if image is None or kernel is None or out is None or image.dim() != 4 or bias is not None:
        return None
    if transposed or groups != 1 or list(stride) != [1, 1] or list(dilation) != [1, 1]:
        return None
    size = 2 * padding[0] + 1
    if padding[0] != padding[1] or kernel.shape[2:] != image.shape[2:] or tuple(out.shape[2:]) != (size, size):
        return None
    if max(kernel.shape[2:]) <= size:  # a 3x3 image with a 3x3 kernel is an ordinary convolution: left alone
        return None
    return list(padding)


def _swapped_weight_gradient(graph: torch.fx.Graph, a: Any, b: Any, padding: list[int], groups: int) -> torch.fx.Node:
    """Nodes for ``conv(a, b)`` of image-sized kernels as a weight gradient (``groups`` of them at once, their
    channels side by side): ``wgrad`` of the swapped tensors, swapped back."""
    aten = torch.ops.aten
    image, kernel = a.meta["val"], b.meta["val"]
    size = 2 * padding[0] + 1
    x = graph.call_function(aten.permute.default, (a, [1, 0, 2, 3]))
    gy = graph.call_function(aten.permute.default, (b, [1, 0, 2, 3]))
    shape = [kernel.shape[0], image.shape[0] // groups, size, size]
    weight = graph.call_function(aten.empty.memory_format, (shape,), {"dtype": image.dtype, "device": image.device})
    geometry = ([1, 1], padding, [1, 1], False, [0, 0], groups, [False, True, False])
    grads = graph.call_function(aten.convolution_backward.default, (gy, x, weight, None, *geometry))
    wgrad = graph.call_function(operator.getitem, (grads, 1))
    return graph.call_function(aten.permute.default, (wgrad, [1, 0, 2, 3]))


def _merge_groups(graph: torch.fx.Graph, cat: torch.fx.Node) -> int:
    """Where ``cat`` joins, along dim 1, image-sized-kernel convolutions of consecutive equal slices (dim 0) of one
    tensor ``A`` and one tensor ``B`` (PyTorch's double backward of a grouped convolution, one convolution a group,
    that is a task under ``vmap``), replace it by one weight gradient with as many groups: ``cat`` of the groups'
    ``(C_in, C_out, k, k)`` results along dim 1 is the swap of the grouped ``(groups * C_out, C_in, k, k)`` one.
    Returns the convolutions it replaced (0: the pattern is not there)."""
    parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
    if dim not in (1, -3) or len(parts) < 2 or not all(isinstance(part, torch.fx.Node) for part in parts):
        return 0
    paddings = [_image_kernel_padding(part) for part in parts]
    if any(padding is None or padding != paddings[0] for padding in paddings) or any(len(p.users) != 1 for p in parts):
        return 0
    sources = []
    for operand in (0, 1):  # the images A, then the kernels B: one tensor each, cut into consecutive equal slices
        slices = [_dim0_slice(part.args[operand]) for part in parts]
        if any(cut is None or cut[0] is not slices[0][0] for cut in slices):
            return 0
        width = slices[0][2] - slices[0][1]
        if [cut[1:] for cut in slices] != [(g * width, (g + 1) * width) for g in range(len(parts))]:
            return 0
        if slices[0][0].meta["val"].shape[0] != width * len(parts):
            return 0
        sources.append(slices[0][0])
    with graph.inserting_before(cat):
        result = _swapped_weight_gradient(graph, *sources, paddings[0], groups=len(parts))
    cat.replace_all_uses_with(result)
    graph.erase_node(cat)
    for part in parts:
        cuts = [arg for arg in part.args[:2] if isinstance(arg, torch.fx.Node)]
        graph.erase_node(part)
        for cut in cuts:
            if not cut.users:
                graph.erase_node(cut)
    return len(parts)


def _dim0_slice(node: Any) -> tuple[torch.fx.Node, int, int] | None:
    """``(source, start, end)`` where ``node`` is ``aten.slice(source, 0, start, end)`` with step 1, the end clamped to
    the source's length; else None."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.aten.slice.Tensor:
        return None
    defaults = (None, 0, 0, None, 1)  # aten.slice(self, dim=0, start=None, end=None, step=1)
    source, dim, start, end, step = (*node.args, *defaults[len(node.args) :])
    value, start = getattr(source, "meta", {}).get("val"), start or 0
    if value is None or dim != 0 or step != 1 or not isinstance(start, int):
        return None
    length = value.shape[0]
    end = length if end is None else min(end, length)
    return (source, start, end) if isinstance(end, int) else None


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

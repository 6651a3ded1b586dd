"""units_lightning.conv_grads: a 3x3 convolution differentiated at every order through its own data and weight
gradients: the same derivatives as PyTorch's, and no per-task image-sized convolution in a second-order vmap step."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from units_lightning.conv_grads import conv3x3_explicit_grads, weight_gradients_for_image_kernels


def test_first_and_second_derivatives_match_finite_differences():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(conv3x3_explicit_grads, (x, w, b))
    assert torch.autograd.gradgradcheck(conv3x3_explicit_grads, (x, w, b))


def second_order_maml(conv, w0, xs, ys):
    """Two inner steps per task under vmap, then a loss and query sets that share the adapted weights."""

    def task(x, y):
        def loss(w):
            return conv(torch.tanh(conv(x, w, None)), w, None).square().mean() - (conv(x, w, None) * y).mean()

        w1 = w0 - 0.1 * grad(loss)(w0)
        w2 = w1 - 0.1 * grad(loss)(w1)
        return loss(w2) + vmap(lambda q: conv(q, w2, None).square().mean())(torch.stack([x, y])).sum()

    return vmap(task)(xs, ys).sum()


class Convolutions(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = []  # the kernel (weight) shape of every forward convolution

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.kernels.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


def test_a_second_order_vmap_step_has_the_same_meta_gradient_without_image_sized_kernels():
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 6, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    xs, ys = torch.randn(2, 3, 4, 6, 7, 7, generator=g, dtype=torch.float64).unbind()
    reference = lambda x, w, b: F.conv2d(x, w, b, padding=1)  # noqa: E731
    seen = {}
    for name, conv in (("aten", reference), ("explicit", conv3x3_explicit_grads)):
        with Convolutions() as mode:
            (seen[name],) = torch.autograd.grad(second_order_maml(conv, w0, xs, ys), w0)
        seen[f"{name} kernels"] = {shape[-2:] for shape in mode.kernels}
    torch.testing.assert_close(seen["explicit"], seen["aten"], rtol=1e-12, atol=1e-12)
    assert (7, 7) in seen["aten kernels"]  # PyTorch's double backward: image-sized kernels (one per task)
    assert seen["explicit kernels"] == {(3, 3)}


def test_inside_a_compiled_graph_it_is_the_plain_convolution(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x, w = torch.randn(2, 3, 5, 5, requires_grad=True), torch.randn(4, 3, 3, 3)
    out = conv3x3_explicit_grads(x, w, None)
    assert "Convolution" in type(out.grad_fn).__name__  # aten's own, which Dynamo can trace under vmap
    torch.testing.assert_close(out, F.conv2d(x, w, padding=1))


def image_kernel_convolutions(a, b, c, d):
    # the weight term of PyTorch's double backward (batch and channels swapped, the image as the kernel), and two
    # convolutions it must leave alone: a 3x3 kernel, and a 3x3 image whose kernel is its size but no larger
    return F.conv2d(a, b, padding=1), F.conv2d(a, c, padding=1), F.conv2d(d, c, padding=1)


def test_the_graph_pass_rewrites_image_sized_kernels_as_weight_gradients_with_the_same_values():
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 4, 7, 6, generator=g, dtype=torch.float64)  # (channels in, images, height, width)
    b = torch.randn(3, 4, 7, 6, generator=g, dtype=torch.float64)  # (channels out, images, height, width)
    c = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)
    d = torch.randn(6, 4, 3, 3, generator=g, dtype=torch.float64)
    module = make_fx(image_kernel_convolutions, tracing_mode="fake")(a, b, c, d)
    assert weight_gradients_for_image_kernels(module.graph) == 1
    module.recompile()
    targets = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten.convolution.default) == 2  # the two 3x3 ones, left as they were
    assert torch.ops.aten.convolution_backward.default in targets
    for ours, expected in zip(module(a, b, c, d), image_kernel_convolutions(a, b, c, d), strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


def grouped_double_backward_terms(a, b, groups, order=None):
    # PyTorch's double backward of a grouped convolution, as it reaches Inductor's post-grad graph: the images `a`
    # (images, groups x channels in, h, w) and the image-sized kernels `b` (images, groups x channels out, h, w)
    # swapped, cut into the groups' slices, one convolution each, joined along dim 1
    swapped_a, swapped_b = a.permute(1, 0, 2, 3), b.permute(1, 0, 2, 3)
    ci, co = a.shape[1] // groups, b.shape[1] // groups
    order = range(groups) if order is None else order
    parts = [F.conv2d(swapped_a[g * ci : (g + 1) * ci], swapped_b[g * co : (g + 1) * co], padding=1) for g in order]
    return torch.cat(parts, 1)


@pytest.mark.parametrize(("order", "grouped"), [(None, True), ([1, 0, 2], False)], ids=["groups", "out-of-order"])
def test_the_groups_of_one_grouped_convolution_become_one_grouped_weight_gradient(order, grouped):
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3 * 5, 7, 6, generator=g, dtype=torch.float64)  # 4 images, 3 groups of 5 channels
    b = torch.randn(4, 3 * 2, 7, 6, generator=g, dtype=torch.float64)  # 2 output channels a group
    module = make_fx(lambda a, b: grouped_double_backward_terms(a, b, 3, order), tracing_mode="fake")(a, b)
    assert weight_gradients_for_image_kernels(module.graph) == 3
    module.recompile()
    calls = [node for node in module.graph.nodes if node.op == "call_function"]
    backward = [node for node in calls if node.target is torch.ops.aten.convolution_backward.default]
    assert not any(node.target is torch.ops.aten.convolution.default for node in calls)
    # in order, one weight gradient with 3 groups; out of order, not the pattern: one a group, as before
    assert [node.args[9] for node in backward] == ([3] if grouped else [1, 1, 1])
    torch.testing.assert_close(module(a, b), grouped_double_backward_terms(a, b, 3, order), rtol=1e-12, atol=1e-12)


def test_the_pass_is_named_the_same_in_every_process_for_the_caches():
    from units_lightning.conv_grads import WeightGradientPass

    # Inductor's graph cache keys on uuid(), compile_ahead's folder on the options' repr: neither an object's address
    assert WeightGradientPass().uuid() == WeightGradientPass().uuid()
    assert repr(WeightGradientPass()) == repr(WeightGradientPass()) and "0x" not in repr(WeightGradientPass())

"""The backbone's batch norm and block order compute the textbook formulas, value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from units_lightning.backbones import BatchNorm, ConvNet, conv3x3, conv3x3_batch_norm, patch_moments


def test_batch_norm_equals_the_textbook_formula_with_its_second_derivatives():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    norm = BatchNorm(3).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.normal_(generator=g)

    def textbook(x):
        mean = x.mean(dim=(0, 2, 3), keepdim=True)
        var = ((x - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
        return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.view(1, -1, 1, 1) + norm.bias.view(1, -1, 1, 1)

    ours, ref = norm(x), textbook(x)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, F.batch_norm(x, None, None, norm.weight, norm.bias, True), rtol=1e-12, atol=1e-12)
    probe = torch.randn(ours.shape, generator=g, dtype=torch.float64)
    for out in (ours, ref):  # gradient of a gradient, as MAML's meta-gradient needs
        (gx,) = torch.autograd.grad((out * probe).sum(), x, create_graph=True)
        second = torch.autograd.grad((gx**2).sum(), [x, norm.weight], allow_unused=True)
        if out is ours:
            expected = (gx, second)
    torch.testing.assert_close(expected[0], gx, rtol=1e-10, atol=1e-12)
    for a, b in zip(expected[1], second, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bn_steps", [1, 3])
def test_pooling_before_the_activation_equals_the_papers_block_order(bn_steps):
    torch.manual_seed(0)
    net = ConvNet((3, 16, 16), 4, filters=5, blocks=3, bn_steps=bn_steps).double()
    x = torch.randn(7, 3, 16, 16, dtype=torch.float64)

    def papers_order(x, step):
        for conv, norm in zip(net.convs, net.norms, strict=True):
            x = net.pool(net.activation(norm(conv(x), step)))
        return net.classifier(x.flatten(1))

    for step in range(bn_steps):
        ours, ref = net(x, step), papers_order(x, step)
        assert torch.equal(ours, ref)
        for a, b in zip(
            torch.autograd.grad(ours.square().sum(), list(net.parameters()), allow_unused=True),
            torch.autograd.grad(ref.square().sum(), list(net.parameters()), allow_unused=True),
            strict=True,
        ):
            assert (a is None and b is None) or torch.equal(a, b)


def test_the_convolution_as_shifted_taps_gives_the_meta_gradients_of_conv2d_under_vmap():
    """``conv3x3(as_shifts=True)`` (Omniglot's first layer in a compiled graph) against ``F.conv2d``: per-task
    weights under ``vmap``, an inner step by ``torch.func.grad`` and the meta-gradient through it, in float64."""
    from torch.func import grad, vmap

    from units_lightning.backbones import conv3x3

    g = torch.Generator().manual_seed(0)
    tasks, images, filters, channels = 3, 4, 5, 1
    x = torch.randn(tasks, images, channels, 6, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(filters, channels, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(filters, generator=g, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(images, filters, 6, 6, generator=g, dtype=torch.float64)

    def meta_loss(as_shifts):
        def task_loss(w, b, images):
            return (torch.tanh(conv3x3(images, w, b, as_shifts)) * probe).sum()

        def adapted_loss(images):
            gw, gb = grad(task_loss, argnums=(0, 1))(weight, bias, images)
            return task_loss(weight - 0.1 * gw, bias - 0.1 * gb, images)

        return vmap(adapted_loss)(x).sum()

    values, grads = [], []
    for as_shifts in (False, True):
        loss = meta_loss(as_shifts)
        values.append(loss)
        grads.append(torch.autograd.grad(loss, [weight, bias]))
    torch.testing.assert_close(values[1], values[0], rtol=1e-12, atol=1e-12)
    for ours, ref in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_convnet_sums_shifted_taps_only_inside_a_compiled_graph(monkeypatch):
    """Eager forward passes (CPU runs, CUDA graphs) keep ``F.conv2d`` in every layer: they print what they printed
    before the compiled graphs took the shifted taps."""
    monkeypatch.setattr(F, "pad", lambda *a, **k: pytest.fail("shifted taps taken outside a compiled graph"))
    net = ConvNet((1, 28, 28), 5, filters=8)
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 5)


def test_shifted_taps_refuse_more_than_one_channel():
    from units_lightning.backbones import conv3x3

    with pytest.raises(ValueError, match="single-channel"):
        conv3x3(torch.zeros(2, 3, 5, 5), torch.zeros(4, 3, 3, 3), torch.zeros(4), as_shifts=True)


@pytest.mark.parametrize("compiling", [False, True], ids=["eager", "compiled-form"])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_folded_convolution_and_batch_norm_equal_them_one_after_the_other(channels, compiling, monkeypatch):
    # patch_moments takes the covariance as products per image eagerly and as one reduction inside a compiled graph
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, channels, 7, 9, generator=g, dtype=torch.float64) + 2.0  # an offset: the moments are centred
    weight = torch.randn(4, channels, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    norm = BatchNorm(4).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.normal_(generator=g)
    out = F.conv2d(x, weight, bias, padding=1)
    mean, cov = patch_moments(x)  # the convolution's batch statistics from them, as the folded form takes them
    flat = weight.flatten(1)
    torch.testing.assert_close(flat @ mean + bias, out.mean(dim=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(((flat @ cov) * flat).sum(1), out.var(dim=(0, 2, 3), unbiased=False), rtol=1e-12, atol=0)
    folded = conv3x3_batch_norm(x, weight, bias, norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(folded, norm(conv3x3(x, weight, bias)), rtol=1e-12, atol=1e-12)
    if channels == 1:  # and as the shifted taps of a compiled graph
        shifted = conv3x3_batch_norm(x, weight, bias, norm.weight, norm.bias, norm.eps, as_shifts=True)
        torch.testing.assert_close(shifted, folded, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(5, 1, 28, 28), (3, 3, 32, 32), (2, 4, 7, 5)])
def test_eager_patch_moments_gather_the_patches_of_unfold_without_im2col(shape):
    from torch.utils._python_dispatch import TorchDispatchMode

    from units_lightning.backbones import _patches

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(shape, dtype=torch.float64)
    assert torch.equal(_patches(x), F.unfold(x, 3, padding=1))
    with Calls() as calls:
        patch_moments(x)
    assert "im2col" not in calls.names  # on CUDA one kernel launch per image (backbones.patch_moments)


def test_a_folded_first_norm_keeps_the_parameters_and_is_the_default_backbones_option():
    from units_lightning.module import UnitsMAML

    plain, folded = ConvNet((1, 28, 28), 5, filters=4), ConvNet((1, 28, 28), 5, filters=4, fold_first_norm=True)
    assert plain.state_dict().keys() == folded.state_dict().keys()  # a checkpoint loads into either
    assert UnitsMAML(filters=4, fold_first_norm=True).engine.model.fold_first_norm
    backbone = ConvNet((1, 28, 28), 5, filters=4)
    with pytest.raises(ValueError, match=r"^model.fold_first_norm shapes the default .*give --model.fold_first_norm f"):
        UnitsMAML(backbone=backbone, fold_first_norm=True)
    # both named at once (the Omniglot configs set these two and explicit_conv_grads)
    with pytest.raises(ValueError, match=r"^model.per_step_bn and model.fold_first_norm shape .*bn false --model.fold"):
        UnitsMAML(backbone=backbone, per_step_bn=True, fold_first_norm=True)


def test_the_folded_batch_norm_under_half_precision_autocast_is_as_close_to_float32_as_the_plain_one():
    # In float16 the patches' covariance of 160 images overflows; the moments are taken in float32 whatever autocast
    # says, so the folded model's error is that of half-precision convolutions, as the plain model's is.
    torch.manual_seed(0)
    plain = ConvNet((1, 28, 28), 5, filters=8)
    folded = ConvNet((1, 28, 28), 5, filters=8, fold_first_norm=True)
    folded.load_state_dict(plain.state_dict())
    x = torch.randn(160, 1, 28, 28) * 2 + 1
    reference = plain(x)
    with torch.autocast("cpu", dtype=torch.float16):
        errors = [(model(x).float() - reference).abs().max().item() for model in (plain, folded)]
        assert patch_moments(x)[1].dtype == torch.float32
    assert errors[1] < 3 * errors[0] + 1e-3, errors

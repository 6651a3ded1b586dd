"""benchmarks/conv_forms.py: the per-task convolution as a grouped convolution and as a product of patches give the
same meta-gradients (its timings need a GPU to mean anything)."""

import pytest
import torch

from benchmarks.conv_forms import SHAPES, grouped, main, meta_step, patches


@pytest.mark.parametrize("channels", [1, 3])
def test_both_forms_give_the_same_meta_gradient_in_float64(channels):
    generator = torch.Generator().manual_seed(1)
    w = torch.randn(64, channels, 3, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    b = torch.randn(64, generator=generator, dtype=torch.float64, requires_grad=True)
    xs, xq = (torch.randn(2, 3, channels, 7, 5, generator=generator, dtype=torch.float64) for _ in "sq")
    expected = torch.autograd.grad(meta_step(grouped)(w, b, xs, xq), (w, b))
    got = torch.autograd.grad(meta_step(patches)(w, b, xs, xq), (w, b))
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)
    assert expected[0].abs().sum() > 0  # the second-order path carries a gradient


def test_the_benchmark_prints_a_row_per_shape_and_checks_them(capsys, monkeypatch):
    import benchmarks.conv_forms as conv_forms

    monkeypatch.setattr(conv_forms, "SHAPES", [("tiny layer", 2, 3, 4, 5)])
    main(["--device", "cpu", "--check", "--warmup", "0", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert "tiny layer (2 tasks x 3 images, 4 -> 64 channels at 5x5): grouped" in printed and "; patches" in printed
    difference = float(printed.split("meta-gradients differ by ")[1].split()[0])
    assert difference < 1e-12
    assert len(SHAPES) == 8

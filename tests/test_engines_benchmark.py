"""benchmarks/engines.py: the table it prints, with and without the capture check."""

import argparse

import pytest
import torch
import torch._inductor.config as inductor

from benchmarks import engines


def test_the_table_says_which_captures_were_checked_and_how_far_from_eager():
    shape = engines.SHAPES[1]  # omniglot-20w1s at meta-batch 16
    names = ["learn2learn", "batched", "batched+cuda_graph", "batched+compile"]
    row = {
        "shape": shape,
        "tasks_per_s": dict(zip(names, (16.0, 120.0, 280.0, 400.0), strict=True)),
        "memory": dict.fromkeys(names, 100.0),
        "ml_over_nts": dict.fromkeys(names, 1.05),
        # first Units-NTS and Units-ML steps, then the three errors (None: run with --no-check)
        "capture": {"cuda_graph": (0.5, 30.0, 0.2, 0.2, 2e-15), "compile": (190.0, 40.0, None, None, None)},
    }
    lines = engines.table([row], names).splitlines()
    assert lines[2].startswith("| omniglot-20w1s (16) | 16.00 | 120.00 | 280.00 | 400.00 | 7.50x | 17.50x | 25.00x |")
    assert "| omniglot-20w1s | cuda_graph | 0.5 | 30.0 | 2.0e-01 | 2.0e-01 | 2.0e-15 |" in lines
    assert "| omniglot-20w1s | compile | 190.0 | 40.0 | not checked | not checked | not checked |" in lines


def test_inductor_settings_are_read_as_literals_and_a_key_torch_lacks_is_refused():
    settings = engines.inductor_settings(["coordinate_descent_tuning=True", "triton.max_tiles=3"])
    assert settings == {"coordinate_descent_tuning": True, "triton.max_tiles": 3}
    with inductor.patch(settings):  # as main() applies them around the timed run
        assert inductor.coordinate_descent_tuning is True and inductor.triton.max_tiles == 3
    with pytest.raises(ValueError, match="has no torch._inductor.config.coordinate_descent_tunning"):
        engines.inductor_settings(["coordinate_descent_tunning=True"])
    with pytest.raises(ValueError, match="has no torch._inductor.config.triton.nope"):
        engines.inductor_settings(["triton.nope=1"])
    with pytest.raises(ValueError, match="give KEY=VALUE"):
        engines.inductor_settings(["coordinate_descent_tuning"])


def test_fold_first_norm_times_each_batched_variant_folded_beside_the_plain_one():
    args = argparse.Namespace(engines=["learn2learn", "batched"], capture=["cuda_graph"], fold_first_norm=True)
    args.explicit_conv_grads = False
    names = engines.engine_names(args)
    assert names == ["learn2learn", "batched", "batched+cuda_graph", "batched/folded", "batched+cuda_graph/folded"]
    folded = engines.build(engines.SHAPES[0], "batched", torch.device("cpu"), fold_first_norm=True)
    assert (
        folded.engine.model.fold_first_norm
        and not engines.build(engines.SHAPES[0], "batched", "cpu").engine.model.fold_first_norm
    )
    args.fold_first_norm = False
    assert engines.engine_names(args) == names[:3]


def test_explicit_conv_grads_times_each_batched_variant_beside_the_plain_one():
    captures = ["cuda_graph", "compile"]
    args = argparse.Namespace(engines=["learn2learn", "batched"], capture=captures, fold_first_norm=True)
    args.explicit_conv_grads = True
    names = engines.engine_names(args)
    assert names[-6:-3] == ["batched/explicit", "batched+cuda_graph/explicit", "batched+compile/explicit"]
    assert names[-2] == "batched+cuda_graph/folded/explicit"  # both options, as the Omniglot configs set them
    assert engines.variant("batched+cuda_graph/explicit") == ("batched", "cuda_graph", {"explicit_conv_grads": True})
    both = {"fold_first_norm": True, "explicit_conv_grads": True}
    assert engines.variant("batched+cuda_graph/folded/explicit") == ("batched", "cuda_graph", both)
    assert engines.variant("batched+compile/folded") == ("batched", "compile", {"fold_first_norm": True})
    assert engines.variant("learn2learn") == ("learn2learn", "", {})
    model = engines.build(engines.SHAPES[0], "batched", torch.device("cpu"), explicit_conv_grads=True)
    assert model.engine.model.explicit_conv_grads

"""benchmarks/engines.py: the table it prints, with and without the capture check."""

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

"""benchmarks/kernel_count.py: Inductor's options read and refused, the table, a failed step's reason, and (opt-in:
it compiles on the CPU for minutes) a real count in fresh processes."""

import os

import pytest

from benchmarks import kernel_count

COMPILE_TESTS = os.environ.get("UNITS_LIGHTNING_COMPILE_TESTS") == "1"


def test_options_take_their_types_from_inductors_config():
    options = kernel_count.parse_options("aggressive_fusion=True, max_fusion_size=512,split_reductions=False")
    assert options == {"aggressive_fusion": True, "max_fusion_size": 512, "split_reductions": False}
    assert kernel_count.parse_options("") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agressive_fusion=True", "has no option 'agressive_fusion'"),
        ("aggressive_fusion=yes", "aggressive_fusion takes True or False, not 'yes'"),
        ("max_fusion_size=big", "max_fusion_size takes a number, not 'big'"),
        ("aggressive_fusion", "has no value: write name=value"),
    ],
)
def test_a_wrong_option_is_refused_with_the_reason(text, message):
    with pytest.raises(SystemExit, match=message):
        kernel_count.parse_options(text)


def test_a_misspelt_option_is_refused_before_anything_compiles(monkeypatch):
    monkeypatch.setattr(kernel_count, "run_child", lambda *args: pytest.fail("compiled before checking the options"))
    with pytest.raises(SystemExit, match="has no option 'max_fusion'"):
        kernel_count.main(["--config", "configs/quickstart.yaml", "--options", "", "max_fusion=2"])


def test_the_table_names_the_defaults_and_rounds():
    results = {
        "": {"kernels": 435, "nodes_before_fusion": 601, "megabytes": 5486.9, "first_step_s": 95.04, "step_ms": 3168.2},
        "aggressive_fusion=True": {
            "kernels": 435, "nodes_before_fusion": 601, "megabytes": 5487.0, "first_step_s": 144.0, "step_ms": 7689
        },
    }  # fmt: skip
    lines = kernel_count.table(results).splitlines()
    assert lines[2] == "| defaults | 435 | 601 | 5487 | 95.0 | 3168.2 |"
    assert lines[3] == "| aggressive_fusion=True | 435 | 601 | 5487 | 144.0 | 7689.0 |"


def test_a_step_that_fails_says_why(tmp_path):
    with pytest.raises(SystemExit, match=r"failed \(exit [1-9]\d*\):[\s\S]*does-not-exist"):
        kernel_count.run_child(str(tmp_path / "does-not-exist.yaml"), "", [])


@pytest.mark.skipif(not COMPILE_TESTS, reason="compiles on the CPU (minutes): UNITS_LIGHTNING_COMPILE_TESTS=1")
def test_a_real_count_in_fresh_processes(capsys):
    kernel_count.main(
        ["--config", "configs/quickstart.yaml", "--options", "", "max_fusion_size=1", "--",
         "--model.filters", "4", "--model.inner_steps", "1", "--trainer.accelerator", "cpu"]
    )  # fmt: skip
    rows = capsys.readouterr().out.splitlines()[-2:]
    defaults, unfused = (row.split(" | ") for row in rows)
    assert defaults[0] == "| defaults" and unfused[0] == "| max_fusion_size=1"
    assert int(defaults[2]) == int(unfused[2]) > 0  # the same graph: the same IR nodes
    assert 0 < int(defaults[1]) < int(unfused[1])  # fusing nodes at most one to a kernel generates more kernels
    assert 0 < int(defaults[3]) < int(unfused[3])  # and more memory traffic: unfused nodes write what the next reads

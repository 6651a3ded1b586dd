"""benchmarks/side_by_side.py: variants of one config run side by side, each with a compile cache of its own."""

import json
from pathlib import Path

import pytest
from tiny_setup import QUICKSTART, TINY_QUICKSTART

from benchmarks import side_by_side
from benchmarks.side_by_side import Run, Variant

# Stands in for whole_run.py: records its options and environment, and writes figures that depend on its variant
FAKE_WHOLE_RUN = """
import json, os, sys
args = sys.argv[1:]
if "--fail" in args:
    sys.exit(3)
out = args[args.index("--json") + 1]
folded = "--folded" in args
json.dump({
    "device": "fake", "warmup_step_ms": 8.0 if folded else 10.0, "scoring_step_ms": 15.0 if folded else 12.0,
    "one_off_s": 1.5, "total_s": 20.0, "full_total_s": 600.0, "argv": args,
    "cache": os.environ["UNITS_LIGHTNING_COMPILE_CACHE"], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "knob": os.environ.get("SIDE_BY_SIDE_KNOB"), "script": __file__, "path": os.environ.get("PYTHONPATH", ""),
    "record": {"left": "out"},
}, open(out, "w"))
"""


def test_variants_are_parsed_from_a_name_its_environment_and_its_options():
    assert side_by_side.parse_variant("plain") == Variant("plain")
    assert side_by_side.parse_variant("fold-1=--model.fold_first_norm true --x 'a b'") == Variant(
        "fold-1", ("--model.fold_first_norm", "true", "--x", "a b")
    )
    assert side_by_side.parse_variant("v7=TORCH_CUDNN_V8_API_DISABLED=1 A_2='x y' --trainer.x=1 B=2") == Variant(
        "v7", ("--trainer.x=1", "B=2"), (("TORCH_CUDNN_V8_API_DISABLED", "1"), ("A_2", "x y"))
    )  # the environment comes first; after the first option every word is fit's
    with pytest.raises(Exception, match="NAME\\[@TREE\\]=OPTIONS"):
        side_by_side.parse_variant("a/b=--x 1")
    with pytest.raises(Exception, match="NAME\\[@TREE\\]=OPTIONS"):
        side_by_side.parse_variant("a@=--x 1")
    before = side_by_side.parse_variant("before@/some/tree=--x 1")
    assert (before.name, before.options, before.tree) == ("before", ("--x", "1"), Path("/some/tree").resolve())
    with pytest.raises(Exception, match="not an environment variable's name"):
        side_by_side.parse_variant("a=lower=1")


def test_a_round_runs_its_variants_together_one_a_gpu_and_in_turn_without_gpus():
    names = ["a", "b", "c"]
    assert side_by_side.waves(names, 2, ["0", "1"]) == [
        [Run("a", 1, "0"), Run("b", 1, "1")],
        [Run("c", 1, "0")],
        [Run("a", 2, "1"), Run("b", 2, "0")],  # one GPU on: a GPU's speed favours no variant
        [Run("c", 2, "1")],
    ]
    order = [[(run.variant, run.round) for run in wave] for wave in side_by_side.waves(names, 2, [])]
    assert order == [[("a", 1)], [("b", 1)], [("c", 1)], [("c", 2)], [("b", 2)], [("a", 2)]]


def test_speeds_are_over_the_first_variant_of_the_same_round_and_a_failed_run_says_why():
    runs = [Run("plain", 1, None), Run("folded", 1, None), Run("plain", 2, None), Run("folded", 2, None)]
    row = {"one_off_s": 1.0, "total_s": 10.0, "full_total_s": 120.0}
    figures = {
        runs[0]: {**row, "warmup_step_ms": 10.0, "scoring_step_ms": 12.0},
        runs[1]: {**row, "warmup_step_ms": 8.0, "scoring_step_ms": None},
        runs[2]: {**row, "warmup_step_ms": 20.0, "scoring_step_ms": 24.0},
    }
    lines = side_by_side.table(runs, figures, {runs[3]: "exit status 3: log"}).splitlines()
    assert "speed over plain" in lines[0]
    assert "| plain | 1 | 10.00 / 12.00 | 1.00x / 1.00x |" in lines[2]
    assert "| folded | 1 | 8.00 / - | 1.25x / - |" in lines[3] and "120.0 s = 2.0 min" in lines[3]
    assert "| plain | 2 | 20.00 / 24.00 | 1.00x / 1.00x |" in lines[4]  # its own round's plain run, not round 1's
    assert "| folded | 2 | exit status 3: log |" in lines[5]


def test_each_variant_runs_in_its_own_process_cache_and_gpu(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "fake_whole_run.py"
    fake.write_text(FAKE_WHOLE_RUN)
    monkeypatch.setattr(side_by_side, "WHOLE_RUN", fake)
    out = tmp_path / "out"
    figures = side_by_side.main(
        ["--config", "configs/x.yaml", "--steps", "50", "--rounds", "2", "--gpus", "3", "5", "--out", str(out),
         "--variant", "plain", "--variant", "folded=SIDE_BY_SIDE_KNOB=on --folded --model.x 2",
         "--variant", "broken=--fail",
         "--", "--data.root", "d", "--model.x", "1"]
    )  # fmt: skip
    assert sorted((run.variant, run.round, run.gpu) for run in figures) == [
        ("folded", 1, "5"), ("folded", 2, "3"), ("plain", 1, "3"), ("plain", 2, "5")
    ]  # fmt: skip
    by_name = {(run.variant, run.round): row for run, row in figures.items()}
    folded = by_name["folded", 2]
    assert folded["cache"] == str(out / "folded" / "cache") != by_name["plain", 2]["cache"]  # a cache each, kept
    assert (folded["knob"], by_name["plain", 1]["knob"]) == ("on", None)  # the variant's environment, its own
    assert folded["argv"][:5] == ["--config", "configs/x.yaml", "--steps", "50", "--json"]
    # every run's options, then the variant's (the later wins), then its own run folder
    assert folded["argv"][6:] == [
        "--data.root", "d", "--model.x", "1", "--folded", "--model.x", "2",
        "--trainer.default_root_dir", str(out / "folded" / "round2"),
    ]  # fmt: skip
    assert "record" not in folded
    printed = capsys.readouterr().out
    assert "running plain (round 1, GPU 3), folded (round 1, GPU 5)" in printed
    assert "running broken (round 1, GPU 3)" in printed
    assert "| folded | 2 | 8.00 / 15.00 | 1.25x / 0.80x | 1.5 | 20.0 | 600.0 s = 10.0 min |" in printed
    assert f"| broken | 1 | exit status 3: {out / 'broken' / 'round1.log'} |" in printed


def test_a_variant_of_another_checkout_runs_that_trees_script_config_and_package(tmp_path, monkeypatch):
    fake = tmp_path / "fake_whole_run.py"
    fake.write_text(FAKE_WHOLE_RUN)
    monkeypatch.setattr(side_by_side, "WHOLE_RUN", fake)
    tree = tmp_path / "before"  # an older checkout: its own whole_run.py and configs
    (tree / "benchmarks").mkdir(parents=True)
    (tree / "benchmarks" / "whole_run.py").write_text(FAKE_WHOLE_RUN)
    out = tmp_path / "out"
    figures = side_by_side.main(
        ["--config", "configs/x.yaml", "--rounds", "1", "--out", str(out), "--variant", f"before@{tree}",
         "--variant", "now", "--", "--data.root", "d"]
    )  # fmt: skip
    by_name = {run.variant: row for run, row in figures.items()}
    assert by_name["before"]["script"] == str(tree / "benchmarks" / "whole_run.py")
    assert by_name["before"]["argv"][:2] == ["--config", str(tree / "configs" / "x.yaml")]  # the tree's config
    assert by_name["before"]["path"].split(":")[0] == str(tree)  # its package first
    assert by_name["now"]["script"] == str(fake) and by_name["now"]["argv"][:2] == ["--config", "configs/x.yaml"]
    assert not by_name["now"]["path"].startswith(str(tree))
    with pytest.raises(SystemExit):
        side_by_side.main(["--config", "c.yaml", "--variant", f"x@{tmp_path / 'nothing'}", "--out", str(out / "2")])


def test_a_folder_that_is_not_empty_is_refused(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit):
        side_by_side.main(["--config", "c.yaml", "--variant", "a", "--out", str(tmp_path)])
    assert "not empty" in capsys.readouterr().err


def test_a_run_past_its_limit_is_stopped_and_reported(tmp_path, monkeypatch):
    fake = tmp_path / "sleeps.py"
    fake.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(side_by_side, "WHOLE_RUN", fake)
    run = Run("slow", 1, None)
    commands = {run: side_by_side.command(run, Variant("slow"), "c.yaml", None, [], tmp_path)}
    envs = {run: side_by_side.environment(run, Variant("slow"), tmp_path)}
    assert side_by_side.run_wave([run], commands, envs, tmp_path, limit=0.5) == {run: "stopped after 0.5 s (--limit)"}


@pytest.mark.slow
def test_a_tiny_quick_start_is_timed_by_the_real_whole_run(tmp_path, capsys):
    # the real whole_run.py in a process of its own: the figures it writes are those the table reads
    figures = side_by_side.main(
        ["--config", str(QUICKSTART), "--steps", "12", "--rounds", "1", "--out", str(tmp_path / "out"),
         "--variant", "folded=--model.fold_first_norm true",
         "--", "--block", "2", *TINY_QUICKSTART, "--data.sampler.init_args.warmup_steps=4",
         "--trainer.limit_train_batches=6", "--trainer.logger=false"]
    )  # fmt: skip
    (row,) = figures.values()
    assert row["warmup_step_ms"] > 0 and row["scoring_step_ms"] > 0 and row["steps"] == 12
    assert json.loads((tmp_path / "out" / "folded" / "round1.json").read_text())["config"] == str(QUICKSTART)
    assert "| folded | 1 | " in capsys.readouterr().out

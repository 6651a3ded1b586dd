"""The command line on a label budget and on a diverged run: what the fit summary says, and what is refused."""

import json
from pathlib import Path

import pytest
from test_cli import run_cli

from units_lightning.callbacks import TrainingCollapseWarning


def summary_of(cli):
    return json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())


def test_the_summary_says_the_label_budget_stopped_the_run(tmp_path, capsys):
    # 4 query sets per step (the quick start's 4 tasks): 4, 8, then the 2 that are left.
    cli = run_cli(f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--model.label_budget=10")
    printed = capsys.readouterr().out
    assert "  stopped: label budget of 10 query sets reached" in printed
    assert "labels spent         10 query sets, 50 query images" in printed
    summary = summary_of(cli)
    assert summary["stopped"] == "label budget of 10 query sets reached" and summary["steps"] == 3
    assert summary["labels"]["query_sets"] == 10 and summary["skipped_steps"] == 0


def test_a_budget_below_one_meta_batch_is_refused_with_the_numbers(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"label budget of 2 query sets is smaller than one meta-batch: each step "
        r"labels 4 query sets \(4 tasks x 1 process\)\. Raise model.label_budget to at least 4",
    ):
        run_cli(f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--model.label_budget=2")


def test_a_diverged_run_is_named_in_a_warning_and_the_summary(tmp_path, capsys):
    with pytest.warns(TrainingCollapseWarning, match=r"training looks collapsed at step \d+: over the 2 steps"):
        cli = run_cli(
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--model.lr=1e6", "--collapse.window=2"
        )
    printed = capsys.readouterr().out
    assert "  warning: training looks collapsed at step" in printed and "model.lr" in printed
    summary = summary_of(cli)
    assert summary["collapse_warning"].startswith(f"training looks collapsed at step {summary['collapse_step']}: ")
    assert "stopped:" not in printed and "skipped steps" not in printed

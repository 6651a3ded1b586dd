"""``benchmarks.tables.evaluate``: a run's milestone checkpoints tested in one process give the results of separate
``units-lightning test`` commands; ``execute_run`` uses it, a stopped call continues with the tests left, and a
failing checkpoint is named."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tiny_setup import QUICKSTART, REPO

from benchmarks.tables import evaluate, folders, grid, launcher
from units_lightning.cli import cli_main

MILESTONES = (6, 12)


def _tiny_budget_config(folder: Path) -> Path:
    """The quick start shrunk to seconds with a label budget of 12 query sets (two per step) and a milestone
    checkpoint at 6 and 12, four test tasks."""
    config = yaml.safe_load(QUICKSTART.read_text())
    trainer = config["trainer"]
    trainer.update(max_epochs=1, limit_train_batches=6, val_check_interval=3, log_every_n_steps=1)
    trainer.update(enable_progress_bar=False, enable_model_summary=False)
    milestones = {
        "class_path": "units_lightning.callbacks.MilestoneCheckpoint",
        "init_args": {"milestones": MILESTONES},
    }
    trainer["callbacks"].append(milestones)
    config["model"].update(filters=4, inner_steps=1, label_budget=MILESTONES[-1])
    data = config["data"]["init_args"]
    data.update(image_size=16, val_tasks=4, test_tasks=4, eval_batch_tasks=2, eval_query_shots=2)
    data.update(train_classes=40, eval_classes=10, images_per_class=12)
    data["sampler"]["init_args"].update(tasks=2, query_sets=2, warmup_steps=1)
    path = folder / "tiny_budget.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished tiny budget run of the grid (its own fit command, in this process) with both milestones."""
    folder = tmp_path_factory.mktemp("tables_evaluate")
    options = grid.Options(root=folder / "root", data_root=None)
    (run,) = grid.build_grid([grid.read_config(_tiny_budget_config(folder))], ["Units-ML"], [0], options.root)
    cli_main(grid.fit_command(run, options)[3:])
    targets = grid.targets_of(run.config)
    assert [grid.milestone_checkpoint(run, t) is not None for t in targets] == [True, True]
    return run, options


def _environment() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline"}


@pytest.mark.slow
def test_one_process_writes_what_separate_test_commands_write(tiny_run, tmp_path):
    run, options = tiny_run
    targets = grid.targets_of(run.config)
    for target in targets:  # today's commands, one process each
        done = subprocess.run(
            grid.evaluation_command(run, target, options), cwd=REPO, env=_environment(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
    separate = tmp_path / "separate"
    shutil.move(run.folder / "test", separate)

    assert launcher.execute_run(run, launcher.Launcher(_environment()), None, options) == "done"
    for target in targets:
        ours, theirs = run.folder / "test" / target.name, separate / target.name
        results = json.loads((ours / "results.json").read_text())
        assert results == json.loads((theirs / "results.json").read_text()), target.name
        assert results["checkpoint"] == str(grid.milestone_checkpoint(run, target)) and results["tasks"] == 4
        assert (ours / "config_test.yaml").read_text() == (theirs / "config_test.yaml").read_text()
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    record = json.loads((run.folder / folders.RECORD).read_text())
    assert list(record["tests"]) == ["test-labels-00006+labels-00012"]
    assert record["tests"]["test-labels-00006+labels-00012"]["returncode"] == 0
    log = (run.folder / "console" / f"{launcher.MILESTONE_LOG}.log").read_text()
    assert "=== test labels-00006 (1 of 2): units-lightning test --config " in log
    assert "=== test labels-00012: done in " in log and "2 of 2 checkpoints tested in one process" in log


def test_a_failing_checkpoint_is_named_and_the_others_are_still_tested(tiny_run, tmp_path, capsys):
    run, options = tiny_run
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint")
    good = grid.milestone_checkpoint(run, grid.targets_of(run.config)[-1])
    into = tmp_path / "test"
    shared = grid.shared_test_options(run, options)
    argv = [f"--into={into}", f"--checkpoint=broken={broken}", f"--checkpoint=good={good}", "--", *shared]
    assert evaluate.main(argv) == 1
    out = capsys.readouterr()
    assert "=== test broken: failed: broken (exit status 1) in " in out.out
    assert f"--ckpt_path={broken}" in out.out and str(broken) in out.err  # the command and the error paragraph
    assert out.out.rstrip().endswith("1 of 2 checkpoints tested in one process; failed: broken")
    assert not (into / "broken").exists()
    assert json.loads((into / "good" / "results.json").read_text())["checkpoint"] == str(good)


def test_a_stopped_test_stops_the_process_and_the_rest_are_left_untested(capsys):
    statuses = iter([0, 143, 0])
    ran = []

    def run(words):
        ran.append(words[-1])
        return next(statuses)

    checkpoints = [("a", "a.ckpt"), ("b", "b.ckpt"), ("c", "c.ckpt")]
    tested = evaluate.evaluate_all(["--config", "x.yaml"], "run/test", checkpoints, run=run)
    assert tested == {"a": 0, "b": 143} and ran == ["--ckpt_path=a.ckpt", "--ckpt_path=b.ckpt"]
    assert evaluate.overall_status(tested) == 143
    assert "=== test b: failed: b (exit status 143)" in capsys.readouterr().out


def test_the_checkpoints_are_named_once_each():
    assert evaluate.parse_checkpoint("labels-04000=a/b=c.ckpt") == ("labels-04000", "a/b=c.ckpt")
    for text in ("labels-04000", "=a.ckpt", "x=", "a/b=c.ckpt"):
        with pytest.raises(Exception, match="expected <name>=<checkpoint file>"):
            evaluate.parse_checkpoint(text)
    with pytest.raises(SystemExit):
        evaluate.parse_arguments(["--into=t", "--checkpoint=a=1.ckpt", "--checkpoint=a=2.ckpt", "--", "--config", "c"])


# --- execute_run with the tests in one process, run by a fake launcher ------------------------------------------


def _finished_fit(tmp_path):
    """A budget run whose fit finished (recorded) and left its four milestone checkpoints (empty files)."""
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = grid.Options(root=tmp_path / "root", data_root=tmp_path / "data")
    (run,) = grid.build_grid(
        [grid.read_config(REPO / "configs" / "budget_omniglot_5w1s.yaml")], ["MAML"], [0], options.root
    )
    fit = {"command": ["python", "-m", "units_lightning", "fit"], "returncode": 0}
    launcher._record_command(run, options, "fit", fit)
    for target in grid.targets_of(run.config):
        path = run.folder / "logs" / "version_0" / "checkpoints" / "milestones" / f"{target.name}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return run, options


class PartialTests(launcher.Launcher):
    """Runs nothing: the milestone tests' process leaves the results of its first ``tests`` checkpoints, then exits
    with ``returncode``."""

    def __init__(self, tests: int, returncode: int):
        super().__init__({})
        self.tests, self.returncode, self.commands = tests, returncode, []

    def run(self, command, log, gpu):
        self.commands.append(command)
        into = Path(next(c for c in command if c.startswith("--into=")).split("=", 1)[1])
        names = [c.split("=", 2)[1] for c in command if c.startswith("--checkpoint=")]
        for name in names[: self.tests]:
            folders.write_json(into / name / "results.json", {"accuracy": {"mean": 0.5, "ci95": 0.01}})
        return self.returncode


def test_a_call_stopped_during_the_tests_continues_with_those_left(tmp_path):
    run, options = _finished_fit(tmp_path)
    stopped = PartialTests(tests=2, returncode=143)
    assert launcher.execute_run(run, stopped, None, options) == "stopped"
    assert not (run.folder / folders.DONE).exists()
    resumed = PartialTests(tests=2, returncode=0)
    assert launcher.execute_run(run, resumed, None, options) == "done"
    (command,) = resumed.commands
    assert [c.split("=", 2)[1] for c in command if c.startswith("--checkpoint=")] == ["labels-08000", "labels-10000"]
    record = json.loads((run.folder / folders.RECORD).read_text())
    assert {key: entry["returncode"] for key, entry in record["tests"].items()} == {
        "test-labels-02000+labels-04000+labels-08000+labels-10000": 143,
        "test-labels-08000+labels-10000": 0,
    }


def test_a_failed_milestone_test_is_named_with_the_log_to_read(tmp_path):
    run, options = _finished_fit(tmp_path)
    outcome = launcher.execute_run(run, PartialTests(tests=3, returncode=1), None, options)
    assert outcome == f"failed: test labels-10000 exited with 1, see {run.folder}/console/test-milestones.log"
    assert not (run.folder / folders.DONE).exists()
    assert launcher.execute_run(run, PartialTests(tests=1, returncode=0), None, options) == "done"


def test_only_milestones_are_tested_together(tmp_path):
    options = grid.Options(root=tmp_path, data_root=None)
    (run,) = grid.build_grid([grid.read_config(REPO / "configs" / "omniglot_5w1s.yaml")], ["Units-ML"], [0], tmp_path)
    with pytest.raises(ValueError, match="only milestone checkpoints .* not \\['top1-val'\\]"):
        grid.milestone_tests_command(run, grid.targets_of(run.config), options)

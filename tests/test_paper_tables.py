"""``benchmarks/paper_tables.py``: the grid of runs, its commands, skipping and resuming, stopping in time, the
confidence intervals, the tables and plots, and one real end-to-end run through the command line."""

import importlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tiny_setup import QUICKSTART, REPO, tiny_data, tiny_model, tiny_trainer

from benchmarks.tables import cli, folders, grid, launcher, metrics, reference, report, statistics
from units_lightning.resume import find_last_checkpoint
from units_lightning.samplers import MultiQuerySampler, RandomSampler

BUDGET_CONFIGS = grid.GROUPS["budget"]


# --- statistics -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, math.tan(0.475 * math.pi)), (2, math.sqrt(2 * 0.95**2 / (1 - 0.95**2)))],
    ids=["cauchy", "two-dof"],
)
def test_the_t_quantile_matches_its_closed_forms(df, expected):
    # df = 1: P(|T| < t) = 2 atan(t) / pi; df = 2: t / sqrt(2 + t^2).
    assert statistics.student_t_quantile(0.975, df) == pytest.approx(expected, rel=1e-10)


def test_the_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 41), 60, 120, 999]:
        for p in (0.9, 0.975, 0.995):
            assert statistics.student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9), (p, df)


def test_the_confidence_interval_over_seeds_is_students():
    # Three seeds at 90, 92, 94: mean 92, sample std 2, half-width t(0.975, 2) * 2 / sqrt(3) = 4.9683.
    summary = statistics.mean_ci95([90.0, 92.0, 94.0])
    assert summary["mean"] == 92.0 and summary["n"] == 3
    assert summary["ci95"] == pytest.approx(4.302652729749464 * 2 / math.sqrt(3), rel=1e-10)
    assert summary["ci95"] == pytest.approx(4.9683, abs=1e-4)
    stats = pytest.importorskip("scipy.stats")
    low, high = stats.t.interval(0.95, 2, loc=92.0, scale=stats.sem([90.0, 92.0, 94.0]))
    assert (summary["mean"] - summary["ci95"], summary["mean"] + summary["ci95"]) == pytest.approx((low, high))
    assert statistics.mean_ci95([95.0]) == {"mean": 95.0, "ci95": None, "n": 1}
    assert statistics.mean_ci95([]) == {"mean": None, "ci95": None, "n": 0}


# --- the paper's numbers ----------------------------------------------------------------------------------------


def _reference_rows(text: str) -> dict[str, list[str]]:
    """Rows of the tables of a section of REFERENCE.md: config name -> cells (``Omniglot 5w1s`` -> omniglot_5w1s)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].lower().replace("mini-imagenet", "miniimagenet").replace("cifar-fs", "cifarfs")
        if line.startswith("|") and name.split(" ")[0] in ("omniglot", "miniimagenet", "cifarfs"):
            rows[name.replace(" ", "_")] = cells[1:]
    return rows


def test_the_papers_numbers_are_those_of_the_reference():
    reference_file = REPO.parent / "shared" / "REFERENCE.md"
    if not reference_file.is_file():
        pytest.skip(f"{reference_file} is absent (it sits beside the repository in the development setup)")
    section = reference_file.read_text().split("## 4.")[1].split("\n## ")[0]
    standard, budget = section.split("Limited label budget")
    keys = ("Units-NTS", "Units-ML", "vacuity<0.2", "vacuity<0.1")
    expected = {
        name: {key: float(cell) if cell else None for key, cell in zip(keys, cells, strict=True)}
        for name, cells in _reference_rows(standard).items()
    }
    assert reference.PAPER_STANDARD == expected
    expected = {
        f"budget_{name}": {
            method: tuple(float(v) for v in cell.split(" / "))
            for method, cell in zip(("MAML", "Units-NTS", "Units-ML"), cells, strict=True)
        }
        for name, cells in _reference_rows(budget).items()
    }
    assert reference.PAPER_BUDGET == expected


# --- methods as overrides ---------------------------------------------------------------------------------------


def _sampler_of(config, method):
    """The sampler a method's overrides configure, instantiated from the override's JSON (or the config's)."""
    for option in grid.method_overrides(grid.METHODS[method], config):
        if option.startswith("--data.sampler="):
            spec = json.loads(option.removeprefix("--data.sampler="))
            module, name = spec["class_path"].rsplit(".", 1)
            return getattr(importlib.import_module(module), name)(**spec["init_args"])
    assert config.sampler.endswith("MultiQuerySampler")
    return MultiQuerySampler(**config.sampler_args)


@pytest.mark.parametrize("name", [*BUDGET_CONFIGS, "omniglot_5w1s", "cifarfs_5w5s"])
def test_every_method_labels_as_many_query_sets_per_step(name):
    config = grid.read_config(REPO / "configs" / f"{name}.yaml")
    labeled = {}
    for method in grid.METHODS:
        sampler = _sampler_of(config, method)
        scores = torch.rand(sampler.num_candidates, sampler.query_sets, generator=torch.Generator().manual_seed(0))
        labeled[method] = int(sampler.select(scores, step=10**6).sum())  # after any warm-up
    assert set(labeled.values()) == {config.sampler_args["tasks"]}, labeled
    maml = grid.method_overrides(grid.METHODS["MAML"], config)
    assert "--model.loss=units_lightning.losses.CrossEntropyLoss" in maml
    assert grid.method_overrides(grid.METHODS["Units-ML"], config) == []  # the config as it is
    assert not any(o.startswith("--model.loss") for o in grid.method_overrides(grid.METHODS["Units-NTS"], config))
    single = _sampler_of(config, "Units-ST")
    assert single.candidates == config.sampler_args["tasks"] * config.sampler_args["query_sets"]
    assert single.warmup_steps == config.sampler_args["warmup_steps"]


def test_budget_configs_are_tested_at_their_milestones_and_standard_ones_by_their_top_k():
    budget = grid.read_config(REPO / "configs" / "budget_omniglot_5w1s.yaml")
    assert budget.kind == "budget" and budget.milestones == (2000, *reference.BUDGET_POINTS)
    assert [t.name for t in grid.targets_of(budget)] == ["labels-02000", "labels-04000", "labels-08000", "labels-10000"]
    cifarfs = grid.targets_of(grid.read_config(REPO / "configs" / "cifarfs_5w5s.yaml"))
    assert [(t.name, t.overrides) for t in cifarfs] == [
        ("top3-val", ()),  # 15 queries a class, as configured
        ("top3-val-2q", ("--data.init_args.eval_query_shots=2",)),  # as many as a training query set: the authors'
    ]
    assert [t.name for t in grid.targets_of(grid.read_config(REPO / "configs" / "omniglot_5w1s.yaml"))] == ["top1-val"]


def test_a_budget_config_without_milestones_is_refused(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "budget_omniglot_5w1s.yaml").read_text())
    config["trainer"]["callbacks"] = [c for c in config["trainer"]["callbacks"] if "Milestone" not in c["class_path"]]
    path = tmp_path / "no_milestones.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="needs a MilestoneCheckpoint"):
        grid.read_config(path)


# --- the grid on disk: dry run, skipping, resuming --------------------------------------------------------------


def _grid(root, seeds=(0, 1, 2), name="budget_omniglot_5w1s", methods=("Units-ML",)):
    configs = cli.resolve_configs([name])
    return grid.build_grid(configs, list(methods), list(seeds), root)


def _options(root, data_root):
    return grid.Options(root=root, data_root=data_root)


def _fake_checkpoint(folder: Path, step: int) -> Path:
    path = folder / "budget_omniglot_5w1s" / "version_0" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step}, path)
    return path


def _fake_milestones(folder: Path) -> None:
    for milestone in (2000, 4000, 8000, 10000):
        path = folder / "logs" / "version_0" / "checkpoints" / "milestones" / f"labels-{milestone:05d}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def _results(accuracy: float, below=((0.2, 0.9, 0.8), (0.1, None, 0.0))) -> dict:
    thresholds = [{"threshold": t, "accuracy": a, "coverage": c} for t, a, c in below]
    return {"accuracy": {"mean": accuracy, "ci95": 0.01}, "tasks": 600, "vacuity_thresholds": thresholds}


def _finish_test(run, name: str, accuracy: float, **kwargs) -> None:
    folders.write_json(run.folder / "test" / name / "results.json", _results(accuracy, **kwargs))


def _finish_fit(run, options) -> None:
    launcher._record_command(
        run, options, "fit", {"command": ["python", "-m", "units_lightning", "fit"], "returncode": 0}
    )


def _prepare(tmp_path):
    """Runs of seed 0: done; seed 1: last.ckpt at step 7; seed 2: fit finished, one test of three done."""
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    done, partial, tested = _grid(options.root)
    folders.write_json(done.folder / folders.DONE, {"finished": "earlier"})
    _fake_checkpoint(partial.folder, step=7)
    _finish_fit(tested, options)
    _fake_milestones(tested.folder)
    _finish_test(tested, "labels-04000", 0.9)
    return options, (done, partial, tested)


def test_the_dry_run_lists_every_run_with_its_commands_and_what_is_done(tmp_path, capsys):
    options, (done, partial, tested) = _prepare(tmp_path)
    argv = ["--dry-run", "--configs", "budget_omniglot_5w1s", "--methods", "units-ml", "--seeds", "0", "1", "2"]
    assert cli.main([*argv, "--root", str(options.root), "--data-root", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"3 runs under {options.root}: 1 done, 2 partial\n")
    assert "budget_omniglot_5w1s / Units-ML / seed 0: done\n" in out
    assert "budget_omniglot_5w1s / Units-ML / seed 1: partial: last.ckpt at step 7\n" in out
    assert "budget_omniglot_5w1s / Units-ML / seed 2: partial: fit finished, 1 of 4 tests done\n" in out
    blocks = out.split("\n\n")
    assert "fit:" not in blocks[1]  # a finished run has nothing to do
    fit_line = next(line for line in blocks[2].splitlines() if line.startswith("  fit: "))
    assert fit_line.endswith("--ckpt_path=last") and "--config configs/budget_omniglot_5w1s.yaml" in fit_line
    assert (
        f"--data.root={tmp_path / 'data' / 'omniglot'}" in fit_line and "--seed_everything=1 --data.seed=1" in fit_line
    )
    assert f"--trainer.default_root_dir={partial.folder}" in fit_line
    tests = [line for line in blocks[3].splitlines() if line.startswith("  test ")]
    assert [t.split(":")[0] for t in tests] == [
        "  test labels-02000 (to do)",
        "  test labels-04000 (done)",
        "  test labels-08000 (to do)",
        "  test labels-10000 (to do)",
    ]
    assert "--trainer.logger=false" in tests[2] and "--seed_everything" not in tests[2]  # the config's test tasks
    assert tests[2].endswith(f"--ckpt_path={tested.folder}/logs/version_0/checkpoints/milestones/labels-08000.ckpt")
    # Before its fit has written them, where the milestone checkpoints will be.
    assert f"--ckpt_path={partial.folder}/*/*/checkpoints/milestones/labels-04000.ckpt" in blocks[2]
    # What a call runs for the tests to do: one process, each checkpoint tested as by its test command above.
    (together,) = [line for line in blocks[3].splitlines() if line.startswith("  tests to do, in one process: ")]
    assert "-m benchmarks.tables.evaluate" in together
    shared = tests[2].split(" -m units_lightning test ", 1)[1].split(" --trainer.default_root_dir=", 1)[0]
    assert together.split(" -- ", 1)[1] == shared and f"--into={tested.folder}/test" in together
    assert [w.split("=", 2)[1] for w in together.split() if w.startswith("--checkpoint=")] == [
        "labels-02000",
        "labels-08000",
        "labels-10000",
    ]


def _option(command, name: str) -> str:
    return next(c for c in command if c.startswith(f"--{name}=")).split("=", 1)[1]


def _tested_checkpoints(command) -> list[str]:
    """The checkpoints a ``benchmarks.tables.evaluate`` command tests, in order."""
    return [c.split("=", 2)[2] for c in command if c.startswith("--checkpoint=")]


class FakeLauncher(launcher.Launcher):
    """Runs nothing: a fit leaves the milestone checkpoints of a finished run, a test its results.json (the milestone
    tests' one process, each of its checkpoints' results.json)."""

    def __init__(self, returncode=0):
        super().__init__({})
        self.commands, self.returncode = [], returncode

    def run(self, command, log, gpu):
        self.commands.append(command)
        if self.returncode != 0:
            return self.returncode
        if command[3] == "fit":
            _fake_milestones(Path(_option(command, "trainer.default_root_dir")))
        elif command[2] == "benchmarks.tables.evaluate":
            for checkpoint in _tested_checkpoints(command):
                folders.write_json(
                    Path(_option(command, "into")) / Path(checkpoint).stem / "results.json", _results(0.95)
                )
        else:
            folders.write_json(Path(_option(command, "trainer.default_root_dir")) / "results.json", _results(0.95))
        return 0


def test_finished_runs_are_skipped_and_the_others_continued_where_they_stopped(tmp_path):
    options, (done, partial, tested) = _prepare(tmp_path)
    fake = FakeLauncher()
    assert [launcher.execute_run(run, fake, None, options) for run in (done, partial, tested)] == ["done"] * 3
    assert [c[3] for c in fake.commands[:1]] == ["fit"] and fake.commands[0][-1] == "--ckpt_path=last"
    milestones = "logs/version_0/checkpoints/milestones"
    # The milestone tests of a run in one process each: all four of the resumed run, the three left of the third.
    assert [c[1:3] for c in fake.commands[1:]] == [["-m", "benchmarks.tables.evaluate"]] * 2
    assert [_tested_checkpoints(c) for c in fake.commands[1:]] == [
        [f"{partial.folder}/{milestones}/labels-{m:05d}.ckpt" for m in (2000, 4000, 8000, 10000)],
        [f"{tested.folder}/{milestones}/labels-{m:05d}.ckpt" for m in (2000, 8000, 10000)],
    ]
    for run in (partial, tested):
        assert (run.folder / folders.DONE).is_file()
        record = json.loads((run.folder / folders.RECORD).read_text())
        assert record["identity"] == grid.fit_identity(run, options) and record["fit"]["finished"]
    record = json.loads((partial.folder / folders.RECORD).read_text())
    assert set(record["tests"]) == {"test-labels-02000+labels-04000+labels-08000+labels-10000"}
    (entry,) = record["tests"].values()
    assert entry["returncode"] == 0 and entry["log"] == f"{partial.folder}/console/test-milestones.log"
    assert record["fit"]["segments"][0]["wall_s"] >= 0
    # A second call has nothing left to do.
    again = FakeLauncher()
    assert [launcher.execute_run(run, again, None, options) for run in (done, partial, tested)] == ["done"] * 3
    assert again.commands == []


def test_runs_start_seed_by_seed_and_those_under_way_first(tmp_path):
    configs = cli.resolve_configs(["budget_omniglot_5w1s", "budget_omniglot_5w5s"])
    runs = grid.build_grid(configs, ["Units-NTS", "Units-ML"], [0, 1], tmp_path)
    label = {run: f"{run.config.name[7:]}/{run.method}/{run.seed}" for run in runs}
    under_way = [r for r in runs if label[r] in ("omniglot_5w5s/Units-ML/0", "omniglot_5w1s/Units-NTS/1")]
    for run in under_way:
        run.folder.mkdir(parents=True)
        (run.folder / folders.RECORD).write_text("{}")
    assert [label[r] for r in launcher.launch_order(runs)] == [
        "omniglot_5w5s/Units-ML/0",  # seed 0: the run under way first, then the grid's order
        "omniglot_5w1s/Units-NTS/0",
        "omniglot_5w1s/Units-ML/0",
        "omniglot_5w5s/Units-NTS/0",
        "omniglot_5w1s/Units-NTS/1",  # seed 1 only after every seed-0 run
        "omniglot_5w1s/Units-ML/1",
        "omniglot_5w5s/Units-NTS/1",
        "omniglot_5w5s/Units-ML/1",
    ]
    assert [label[r] for r in runs][:3] == [  # the grid itself (tables, --dry-run) keeps config, method, seed
        "omniglot_5w1s/Units-NTS/0",
        "omniglot_5w1s/Units-NTS/1",
        "omniglot_5w1s/Units-ML/0",
    ]


def test_a_stopped_fit_is_continued_by_the_next_call_and_a_failed_one_is_named(tmp_path):
    options, (_, partial, _) = _prepare(tmp_path)
    assert launcher.execute_run(partial, FakeLauncher(returncode=143), None, options) == "stopped"
    failed = launcher.execute_run(partial, FakeLauncher(returncode=1), None, options)
    assert failed == f"failed: fit exited with 1, see {partial.folder}/console/fit.log"
    assert not (partial.folder / folders.DONE).exists()
    record = json.loads((partial.folder / folders.RECORD).read_text())
    assert [s["returncode"] for s in record["fit"]["segments"]] == [143, 1] and not record["fit"]["finished"]
    fake = FakeLauncher()
    assert launcher.execute_run(partial, fake, None, options) == "done"
    assert fake.commands[0][-1] == "--ckpt_path=last"


def test_a_fit_killed_after_spending_its_budget_counts_as_finished(tmp_path):
    # `--ckpt_path last` would refuse its last.ckpt (the budget is spent): its tests are what is left to do.
    options, (_, partial, _) = _prepare(tmp_path)
    last = _fake_checkpoint(partial.folder, step=5000)
    torch.save({"global_step": 5000, "label_ledger": {"query_sets": 10000}}, last)
    assert folders.status(partial, options) == "partial: fit finished, 0 of 4 tests done"
    torch.save({"global_step": 4999, "label_ledger": {"query_sets": 9998}}, last)
    assert folders.status(partial, options) == "partial: last.ckpt at step 4999"


def test_a_folder_made_with_other_arguments_is_not_continued(tmp_path):
    options, (_, partial, _) = _prepare(tmp_path)
    _finish_fit(partial, options)
    quick = grid.Options(options.root, options.data_root, extra=("--trainer.max_steps=20",))
    outcome = launcher.execute_run(partial, FakeLauncher(), None, quick)
    assert outcome.startswith(f"conflict: {partial.folder} was made with other arguments")


# --- the metrics of every fit segment ---------------------------------------------------------------------------


def _write_csv(path: Path, header: str, *rows: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


class StoppedFit(launcher.Launcher):
    """A fit stopped by SIGTERM that, as Lightning's ``CSVLogger`` continuing ``version_0``, deletes the
    ``metrics.csv`` there and writes its own rows (``step,val/acc``; no file without rows)."""

    def __init__(self, *rows: str):
        super().__init__({})
        self.rows, self.commands = rows, []

    def run(self, command, log, gpu):
        self.commands.append(command)
        folder = Path(next(c for c in command if c.startswith("--trainer.default_root_dir=")).split("=", 1)[1])
        metrics = folder / "budget_omniglot_5w1s" / "version_0" / "metrics.csv"
        metrics.unlink(missing_ok=True)
        if self.rows:
            _write_csv(metrics, "step,val/acc", *self.rows)
        return 143


def _steps_and_accuracy(rows) -> list[tuple[str, str | None]]:
    return [(row["step"], row.get("val/acc")) for row in rows]


def test_each_fit_segment_keeps_the_metrics_of_those_before(tmp_path):
    options, (_, partial, _) = _prepare(tmp_path)
    segments = [("4,0.5", "9,0.6"), ("5,0.55", "9,0.62", "14,0.7"), (), ("10,0.65", "19,0.8")]
    for rows in segments:  # the third segment is stopped before it logs anything
        assert launcher.execute_run(partial, StoppedFit(*rows), None, options) == "stopped"
    saved = partial.folder / "metrics"
    assert sorted(p.name for p in saved.iterdir()) == ["segment-00.csv", "segment-01.csv"]
    assert (saved / "segment-00.csv").read_text() == "step,val/acc\n4,0.5\n9,0.6\n"
    assert (saved / "segment-01.csv").read_text() == "step,val/acc\n5,0.55\n9,0.62\n14,0.7\n"
    current = partial.folder / "budget_omniglot_5w1s" / "version_0" / "metrics.csv"
    assert metrics.current_metrics(partial.folder) == [current]
    # Every step once, the latest segment's: 9 and 14 were logged again after the resumes at 5 and 10.
    history = [("4", "0.5"), ("5", "0.55"), ("9", "0.62"), ("10", "0.65"), ("19", "0.8")]
    assert _steps_and_accuracy(metrics.run_metrics(partial.folder)) == history
    # Set aside before the next segment, named after the one that wrote it (the fourth in run.json).
    assert metrics.keep_metrics(partial.folder) == [saved / "segment-03.csv"]
    assert not current.exists() and metrics.current_metrics(partial.folder) == []
    assert _steps_and_accuracy(metrics.run_metrics(partial.folder)) == history
    assert metrics.keep_metrics(partial.folder) == []  # nothing new: nothing moved


def test_metrics_set_aside_are_numbered_after_the_fit_segments_run_json_records(tmp_path):
    # run.json records three fit segments; the first one's metrics are saved, the second logged none (stopped before
    # its first row): the third's metrics.csv becomes segment-02.
    folder = tmp_path / "run"
    segments = [{"returncode": 143}] * 3
    folders.write_json(folder / folders.RECORD, {"fit": {"finished": False, "segments": segments}})
    _write_csv(folder / "metrics" / "segment-00.csv", "step,val/acc", "1,0.1")
    _write_csv(folder / "logs" / "version_0" / "metrics.csv", "step,val/acc", "2,0.2")
    assert metrics.keep_metrics(folder) == [folder / "metrics" / "segment-02.csv"]
    # A record behind the files (a fit this script did not record, as when it is killed): above every saved one.
    folders.write_json(folder / folders.RECORD, {"fit": {"finished": False, "segments": segments[:1]}})
    _write_csv(folder / "logs" / "version_0" / "metrics.csv", "step,val/acc", "3,0.3")
    assert metrics.keep_metrics(folder) == [folder / "metrics" / "segment-03.csv"]
    assert [p.read_text().splitlines()[1] for p in metrics.saved_segments(folder)] == ["1,0.1", "2,0.2", "3,0.3"]


def test_the_best_validation_is_the_highest_logged_and_the_earliest_step_of_a_tie():
    rows = [{"step": "9", "train/loss": "1.0"}, {"val/acc": "0.9"}]  # the second has no step: not counted
    rows += [{"step": step, "val/acc": value} for step, value in [("99", "0.5"), ("199", "0.7"), ("299", "0.7")]]
    rows.append({"step": "399", "val/acc": ""})
    assert metrics.best_validation(rows) == {"value": 0.7, "step": 199, "validations": 3}
    assert metrics.best_validation(rows[:1]) is None and metrics.best_validation([]) is None


def test_the_time_limit_stops_launching_sends_sigterm_and_kills_what_ignores_it(tmp_path, monkeypatch):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    runs = _grid(options.root, seeds=(0, 1, 2))
    script = (
        "import pathlib, signal, sys, time; seed = int(sys.argv[1]); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN if seed else (lambda *a: sys.exit(143))); "
        "pathlib.Path(sys.argv[2]).write_text('started'); time.sleep(60)"
    )
    monkeypatch.setattr(
        launcher,
        "fit_command",
        lambda run, options: [sys.executable, "-c", script, str(run.seed), str(run.folder / "x")],
    )
    started = time.monotonic()
    outcomes = launcher.run_grid(runs, options, parallel=2, time_limit=6.0, grace=4.0, report=lambda message: None)
    elapsed = time.monotonic() - started
    assert list(outcomes.values()) == ["stopped"] * 3 and 5.5 < elapsed < 12
    assert (runs[0].folder / "x").exists() and (runs[1].folder / "x").exists()
    assert not (runs[2].folder / "x").exists()  # not launched: no time left when a slot came free
    segments = [json.loads((r.folder / folders.RECORD).read_text())["fit"]["segments"] for r in runs[:2]]
    assert [s[0]["returncode"] for s in segments] == [143, -signal.SIGKILL]  # seed 1 ignores SIGTERM


# --- SIGTERM in training: a checkpoint at that step -------------------------------------------------------------

# Three epochs of three steps, as the budget configs (10 epochs of 500, max_steps 5000): a validation and last.ckpt
# at each epoch's last step.
EPOCHS = dict(
    max_steps=9, max_epochs=3, limit_train_batches=3, val_check_interval=3, limit_val_batches=1, num_sanity_val_steps=0
)


class SigtermAt(Callback):
    """SIGTERM to this process during training step ``step`` (1-based), or during the validation after it."""

    def __init__(self, step: int, stage: str = "train"):
        self.step, self.stage = step, stage

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.stage == "train" and trainer.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.stage == "val" and trainer.global_step == self.step and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGTERM)


def _fit(root, extra=(), ckpt_path=None, **options):
    """The tiny model for ``EPOCHS``, ``last.ckpt`` at each validation; its final step and weights."""
    pl.seed_everything(0, verbose=False)
    data = tiny_data(RandomSampler(tasks=2))
    last = ModelCheckpoint(dirpath=root / "checkpoints", filename="last")
    callbacks = [last, *extra]  # UnitsMAML adds CheckpointOnSigterm to every fit
    trainer = tiny_trainer(root, enable_checkpointing=True, callbacks=callbacks, **{**EPOCHS, **options})
    trainer.fit(tiny_model(sampler=data.sampler), data, ckpt_path=ckpt_path)
    return trainer.global_step, trainer.lightning_module.state_dict()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.parametrize("step", [4, 3], ids=["mid-epoch", "an-epochs-last-step"])
def test_sigterm_in_training_writes_last_ckpt_at_that_step_and_the_run_continues_as_if_uninterrupted(
    tmp_path, uninterrupted, step
):
    # Step 4: CheckpointOnSigterm writes last.ckpt. Step 3, an epoch's last: it does not (a save there resumes with
    # an epoch counted twice); the validation after the step writes it, as in any run.
    with pytest.raises(SIGTERMException):
        _fit(tmp_path, extra=[SigtermAt(step)])
    last = find_last_checkpoint([tmp_path / "checkpoints"])  # as `--ckpt_path last` finds it
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == step and checkpoint["label_ledger"]["query_sets"] == 2 * step
    steps, weights = _fit(tmp_path, ckpt_path=last)
    assert steps == uninterrupted[0] == 9  # all three epochs: none is counted twice
    for name, value in uninterrupted[1].items():
        assert torch.equal(weights[name], value), name


def test_sigterm_during_validation_keeps_the_previous_last_ckpt(tmp_path):
    with pytest.raises(SIGTERMException):
        _fit(tmp_path, extra=[SigtermAt(6, stage="val")], limit_val_batches=2)
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 3  # the validation at step 3 wrote it; the one cut short at 6 did not


# --- tables and plots -------------------------------------------------------------------------------------------


def test_tables_of_runs_left_under_several_roots_take_each_seed_once(tmp_path, capsys):
    """What several hosts bring back (one root per job): seed 0 finished under the first root and again under the
    second, seed 1 only under the second, seed 2 under a third root but unfinished there."""
    (tmp_path / "data" / "miniimagenet").mkdir(parents=True)
    roots = [tmp_path / name for name in ("first", "second", "third")]
    accuracy = {("first", 0): 0.50, ("second", 0): 0.99, ("second", 1): 0.52, ("third", 2): 0.90}
    for (name, seed), value in accuracy.items():
        (run,) = _grid(tmp_path / name, seeds=(seed,), name="miniimagenet_5w1s", methods=("Units-ML",))
        _finish_test(run, "top3-val", value)
        _finish_fit(run, _options(tmp_path / name, tmp_path / "data"))
        if name != "third":
            folders.write_json(run.folder / folders.DONE, {"finished": "now"})
    argv = ["--configs", "miniimagenet_5w1s", "--methods", "Units-ML", "--data-root", str(tmp_path / "data")]
    assert cli.main([*argv, "--root", *map(str, roots), "--tables-only"]) == 0
    printed = capsys.readouterr().out
    assert "miniimagenet_5w1s / Units-ML / seed 0: finished in " in printed and f"using {roots[0]}" in printed
    tables = json.loads((roots[0] / "tables" / "paper_tables.json").read_text())
    accuracy = tables["standard"]["miniimagenet_5w1s"]["Units-ML"]["accuracy"]
    assert accuracy["seeds"] == [0, 1] and accuracy["values"] == pytest.approx([50.0, 52.0])
    assert sorted(r["folder"] for r in tables["runs"]) == [
        str(roots[0] / "miniimagenet_5w1s" / "units-ml" / "seed0"),
        str(roots[1] / "miniimagenet_5w1s" / "units-ml" / "seed1"),
    ]
    with pytest.raises(SystemExit):  # several roots only for tables: a run would not know where to go
        cli.main([*argv, "--root", *map(str, roots[:2])])
    assert "add --tables-only" in capsys.readouterr().err


def test_tables_hold_mean_and_ci_over_seeds_beside_the_papers_numbers(tmp_path):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    (tmp_path / "data" / "miniimagenet").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    budget = _grid(options.root, methods=("MAML", "Units-ML"))
    standard = _grid(options.root, seeds=(0, 1), name="miniimagenet_5w1s", methods=("Units-NTS", "Units-ML"))
    accuracy = {"MAML": (0.70, 0.72, 0.74), "Units-ML": (0.90, 0.92, 0.94)}
    for run in budget:
        for offset, name in enumerate(("labels-04000", "labels-08000", "labels-10000")):
            _finish_test(run, name, accuracy[run.method][run.seed] + offset / 100)
        _finish_test(run, "labels-02000", accuracy[run.method][run.seed] - 0.05)
    for run in standard:
        below = ((0.2, 0.60 + run.seed / 100, 0.5), (0.1, None, 0.0))
        _finish_test(run, "top3-val", 0.50 + run.seed / 100, below=below)
        if run.method == "Units-ML":  # the same ensemble with the authors' 2 queries a class (mini-ImageNet tests 15)
            _finish_test(run, "top3-val-2q", 0.52 + run.seed / 100)
    for run in [*budget, *standard]:
        _finish_fit(run, options)
        folders.write_json(run.folder / folders.DONE, {"finished": "now"})
    unfinished = _grid(options.root, seeds=(3,), methods=("Units-ML",))[0]
    _finish_test(unfinished, "labels-04000", 0.10)  # no done.json: left out
    # One run's validation history in two fit segments: the best over both, with its step, in its runs row.
    nts0 = next(r for r in standard if r.method == "Units-NTS" and r.seed == 0)
    _write_csv(nts0.folder / "metrics" / "segment-00.csv", "step,val/acc", "999,0.40", "1999,0.47")
    _write_csv(nts0.folder / "miniimagenet_5w1s" / "version_0" / "metrics.csv", "step,val/acc", "2999,0.45")

    written = report.write_tables([*budget, unfinished, *standard], tmp_path / "tables", extra=["--data.test_tasks=60"])
    tables = json.loads(written["json"].read_text())
    row = tables["budget"]["budget_omniglot_5w1s"]["Units-ML"]["4000"]
    assert row["values"] == pytest.approx([90.0, 92.0, 94.0]) and row["seeds"] == [0, 1, 2]
    assert row["mean"] == pytest.approx(92.0) and row["ci95"] == pytest.approx(4.9683, abs=1e-4)
    assert row["paper"] == 95.00 and tables["budget"]["budget_omniglot_5w1s"]["MAML"]["10000"]["paper"] == 85.56
    assert tables["budget"]["budget_omniglot_5w1s"]["Units-ML"]["10000"]["mean"] == pytest.approx(94.0)
    nts = tables["standard"]["miniimagenet_5w1s"]["Units-NTS"]
    assert nts["accuracy"]["mean"] == pytest.approx(50.5) and nts["accuracy"]["paper"] == 51.38
    below = tables["standard"]["miniimagenet_5w1s"]["Units-ML"]["vacuity<0.2"]
    assert below["accuracy"]["mean"] == pytest.approx(60.5) and below["accuracy"]["paper"] == 61.25
    assert below["coverage"]["mean"] == pytest.approx(50.0)
    assert tables["standard"]["miniimagenet_5w1s"]["Units-ML"]["vacuity<0.1"]["accuracy"]["n"] == 0  # none kept

    text = written["markdown"].read_text()
    assert "| Units-ML | 87.00 ± 4.97 (3) | 92.00 ± 4.97 (3) | 93.00 ± 4.97 (3) | 94.00 ± 4.97 (3) |" in text
    assert "| Units-ML, paper |  | 95.00 | 97.90 | 98.23 |" in text  # the paper has no 2,000 column
    assert "| MAML, paper |  | 73.44 | 80.18 | 85.56 |" in text
    ci = statistics.student_t_quantile(0.975, 1) * math.sqrt(0.5) / math.sqrt(2)  # two seeds 50, 51: std sqrt(0.5)
    assert (
        f"| miniimagenet_5w1s | 50.50 ± {ci:.2f} (2) | 50.50 ± {ci:.2f} (2) | 60.50 ± {ci:.2f} (2), 50.0% kept |"
        in text
    )
    assert "| miniimagenet_5w1s, paper | 51.38 | 50.86 | 61.25 | 82.26 |" in text
    authors = tables["standard"]["miniimagenet_5w1s"]["Units-ML"]["authors_protocol"]
    assert authors["query_shots"] == 2 and authors["accuracy"]["values"] == pytest.approx([52.0, 53.0])
    assert tables["standard"]["miniimagenet_5w1s"]["Units-NTS"]["authors_protocol"]["accuracy"]["n"] == 0
    assert f"| miniimagenet_5w1s, 2 queries a class (the authors' test) |  | 52.50 ± {ci:.2f} (2) |  |  |" in text
    assert "not comparable with the paper's" in text and "![budget_omniglot_5w1s](budget_omniglot_5w1s.png)" in text
    nts0_row = next(line for line in text.splitlines() if line.startswith("| Units-NTS | 0 | "))
    assert "| 47.00% (1,999; 3) |" in nts0_row
    assert next(r for r in tables["runs"] if r["folder"] == grid.shown(nts0.folder))["best_val"] == {
        "value": 0.47,
        "step": 1999,
        "validations": 3,
    }
    assert "Every run with the overrides `--data.test_tasks=60`: not the configs' protocol" in text
    assert written["budget_omniglot_5w1s"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- end to end -------------------------------------------------------------------------------------------------


def _tiny_config(folder: Path, name: str, budget: bool) -> Path:
    """The quick start shrunk to seconds (six steps, four validation and test tasks)."""
    config = yaml.safe_load(QUICKSTART.read_text())
    trainer = config["trainer"]
    trainer.update(max_epochs=1, limit_train_batches=6, val_check_interval=3, log_every_n_steps=1)
    trainer.update(enable_progress_bar=False, enable_model_summary=False)
    config["model"].update(filters=4, inner_steps=1)
    data = config["data"]["init_args"]
    data.update(image_size=16, val_tasks=4, test_tasks=4, eval_batch_tasks=2, eval_query_shots=2)
    data.update(train_classes=40, eval_classes=10, images_per_class=12)
    data["sampler"]["init_args"].update(tasks=2, query_sets=2, warmup_steps=1)
    if budget:
        config["model"]["label_budget"] = 12
        milestones = {
            "class_path": "units_lightning.callbacks.MilestoneCheckpoint",
            "init_args": {"milestones": [6, 12]},
        }
        trainer["callbacks"].append(milestones)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_end_to_end_through_the_command_line_resumed_then_skipped_on_a_second_call(tmp_path, capsys):
    from units_lightning.cli import cli_main

    budget, standard = _tiny_config(tmp_path, "tiny_budget", True), _tiny_config(tmp_path, "tiny_standard", False)
    root = tmp_path / "root"
    argv = ["--configs", str(budget), str(standard), "--methods", "Units-ML", "--seeds", "0", "--root", str(root)]
    # The budget run stopped after its checkpoint at step 3 (6 labeled query sets, the first milestone saved): its own
    # fit command, run to step 3 here; the summary a finished fit writes is removed, as a kill leaves none.
    (partial,) = grid.build_grid(cli.resolve_configs([str(budget)]), ["Units-ML"], [0], root)
    cli_main([*grid.fit_command(partial, grid.Options(root, None))[3:], "--trainer.max_steps=3"])
    for summary in partial.folder.rglob("summary.json"):
        summary.unlink()
    (first,) = partial.folder.rglob("milestones/labels-00006.ckpt")
    first_written = first.stat().st_mtime_ns
    capsys.readouterr()

    assert cli.main(argv) == 0, capsys.readouterr().out
    assert "2 done" in capsys.readouterr().out
    fit_log = (partial.folder / "console" / "fit.log").read_text()
    assert "--ckpt_path last: resuming from " in fit_log and "last.ckpt (step 3, " in fit_log
    # The metrics of the stopped fit were set aside before the resumed one; the history holds both validations.
    (saved,) = metrics.saved_segments(partial.folder)
    assert saved.name == "segment-00.csv" and len(metrics.current_metrics(partial.folder)) == 1
    validations = [int(row["step"]) for row in metrics.run_metrics(partial.folder) if row.get("val/acc")]
    assert len(validations) == 2 and validations[0] < 3 <= validations[1]  # validation every 3 steps, stopped at 3
    assert first.stat().st_mtime_ns == first_written  # reached before the stop: not saved again
    last = torch.load(first.with_name("labels-00012.ckpt"), map_location="cpu", weights_only=True)
    assert last["global_step"] == 6 and last["label_ledger"]["query_sets"] == 12
    # The standard config tests 2 queries a class, its training query sets hold 1: the ensemble is tested both ways.
    standard_tests = ["top1-val", "top1-val-1q"]
    for name, tests in (("tiny_budget", ["labels-00006", "labels-00012"]), ("tiny_standard", standard_tests)):
        folder = root / name / "units-ml" / "seed0"
        assert (folder / folders.DONE).is_file()
        for test in tests:
            results = json.loads((folder / "test" / test / "results.json").read_text())
            assert results["tasks"] == 4 and 0.0 <= results["accuracy"]["mean"] <= 1.0
        if name == "tiny_standard":
            shots = [json.loads((folder / "test" / t / "results.json").read_text())["task"] for t in tests]
            assert [task["query_shots"] for task in shots] == [2, 1]
    ensemble = json.loads(
        (root / "tiny_standard" / "units-ml" / "seed0" / "test" / "top1-val" / "results.json").read_text()
    )
    assert len(ensemble["ensemble"]) == 1 and Path(ensemble["ensemble"][0]["path"]).name.startswith("step")

    # Nothing is run again; the tables come from the finished runs.
    started = time.monotonic()
    assert cli.main(argv) == 0
    assert time.monotonic() - started < 30 and "start" not in capsys.readouterr().out
    tables = json.loads((root / "tables" / "paper_tables.json").read_text())
    assert tables["budget"]["tiny_budget"]["Units-ML"]["12"]["n"] == 1
    assert tables["standard"]["tiny_standard"]["Units-ML"]["accuracy"]["n"] == 1
    assert tables["standard"]["tiny_standard"]["Units-ML"]["authors_protocol"]["accuracy"]["n"] == 1
    assert tables["runs"][0]["fit_command"][3] == "fit" and tables["runs"][0]["devices"]


def test_a_copy_inside_another_repository_records_no_commit_of_that_repository(tmp_path, monkeypatch):
    """A copy of the project (no .git of its own) inside another checkout must not record that checkout's commit."""
    import subprocess

    outer = tmp_path / "outer"
    (outer / "copy").mkdir(parents=True)
    git = ["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "outer"], check=True)
    outer_head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.delenv("PAPER_TABLES_COMMIT", raising=False)
    for repo, expected in ((outer / "copy", None), (outer, outer_head)):
        monkeypatch.setattr(launcher, "REPO", repo)
        launcher.commit.cache_clear()
        assert launcher.commit() == expected, repo
    monkeypatch.setenv("PAPER_TABLES_COMMIT", "c230fc2")
    monkeypatch.setattr(launcher, "REPO", outer / "copy")
    launcher.commit.cache_clear()
    assert launcher.commit() == "c230fc2"
    launcher.commit.cache_clear()


def test_units_ml_units_nts_and_maml_are_compared_seed_by_seed(tmp_path):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    budget = _grid(options.root, methods=("Units-NTS", "Units-ML"))
    standard = _grid(options.root, seeds=(0, 1), name="omniglot_5w1s", methods=("MAML", "Units-NTS", "Units-ML"))
    # Units-ML ahead of Units-NTS by 1, 2, 1 points; MAML 3 points under Units-NTS in each seed
    accuracy = {"Units-NTS": (0.90, 0.95, 0.92), "Units-ML": (0.91, 0.97, 0.93), "MAML": (0.87, 0.92, 0.89)}
    for run in budget:
        for offset, name in enumerate(("labels-04000", "labels-08000", "labels-10000")):
            _finish_test(run, name, accuracy[run.method][run.seed] + offset / 100)
        _finish_test(run, "labels-02000", accuracy[run.method][run.seed] - 0.05)
    for run in standard:
        _finish_test(run, "top1-val", accuracy[run.method][run.seed])
    finished = [*budget, *standard]
    finished.remove(next(r for r in budget if r.method == "Units-NTS" and r.seed == 2))  # unpaired: left out
    for run in finished:
        _finish_fit(run, options)
        folders.write_json(run.folder / folders.DONE, {"finished": "now"})

    written = report.write_tables([*budget, *standard], tmp_path / "tables")
    tables = json.loads(written["json"].read_text())
    assert list(tables["paired"]["budget_omniglot_5w1s"]) == ["Units-ML - Units-NTS"]  # no MAML run there
    paired = tables["paired"]["budget_omniglot_5w1s"]["Units-ML - Units-NTS"]["8000"]
    assert paired["seeds"] == [0, 1] and paired["values"] == pytest.approx([1.0, 2.0])
    assert paired["mean"] == pytest.approx(1.5) and paired["n"] == 2
    ci = statistics.student_t_quantile(0.975, 1) * math.sqrt(0.5) / math.sqrt(2)  # differences 1, 2: std sqrt(0.5)
    assert paired["ci95"] == pytest.approx(ci)
    standard_pairs = tables["paired"]["omniglot_5w1s"]
    assert list(standard_pairs) == ["Units-ML - Units-NTS", "Units-ML - MAML", "Units-NTS - MAML"]
    assert standard_pairs["Units-ML - Units-NTS"]["accuracy"]["values"] == pytest.approx([1.0, 2.0])
    assert standard_pairs["Units-ML - MAML"]["accuracy"]["values"] == pytest.approx([4.0, 5.0])
    assert standard_pairs["Units-NTS - MAML"]["accuracy"]["values"] == pytest.approx([3.0, 3.0])

    text = written["markdown"].read_text()
    row = f"+1.50 ± {ci:.2f} (2)"
    assert f"| Units-ML - Units-NTS, paired by seed | {row} | {row} | {row} |" in text
    assert "| Units-ML - MAML, paired by seed |" not in text
    assert f"Units-ML - Units-NTS, paired by seed: omniglot_5w1s {row}." in text
    assert f"Units-ML - MAML, paired by seed: omniglot_5w1s +4.50 ± {ci:.2f} (2)." in text
    assert "Units-NTS - MAML, paired by seed: omniglot_5w1s +3.00 ± 0.00 (2)." in text


def test_the_standard_tables_say_how_well_each_method_knows_its_errors_by_both_rankings(tmp_path):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    runs = _grid(options.root, seeds=(0, 1), name="omniglot_5w1s", methods=("MAML", "Units-ML"))
    for run in runs:
        results = _results(0.9)
        half = {"MAML": 0.99, "Units-ML": 0.95}[run.method] - run.seed / 100
        results.update(selective_accuracy=[{"coverage": 1.0, "accuracy": 0.9}, {"coverage": 0.5, "accuracy": half}])
        results.update(aurc=0.02 + run.seed / 100, ece=0.05)
        if run.seed == 1:  # seed 0's results were written before the second ranking existed
            results.update(selective_accuracy_max_probability=[{"coverage": 0.5, "accuracy": half + 0.01}])
            results.update(aurc_max_probability=0.01)
        folders.write_json(run.folder / "test" / "top1-val" / "results.json", results)
        _finish_fit(run, options)
        folders.write_json(run.folder / folders.DONE, {"finished": "now"})

    written = report.write_tables(runs, tmp_path / "tables")
    ranking = json.loads(written["json"].read_text())["standard"]["omniglot_5w1s"]["Units-ML"]["error_ranking"]
    assert ranking["selective_50_vacuity"]["values"] == pytest.approx([95.0, 94.0])
    by_probability = ranking["selective_50_max_probability"]
    assert by_probability["values"] == pytest.approx([95.0]) and by_probability["seeds"] == [1]
    assert ranking["aurc_vacuity"]["mean"] == pytest.approx(2.5) and ranking["ece"]["mean"] == pytest.approx(5.0)
    text = written["markdown"].read_text()
    ci = statistics.student_t_quantile(0.975, 1) * math.sqrt(0.5) / math.sqrt(2)  # values 1 point apart
    assert f"| omniglot_5w1s | MAML | {98.5:.2f} ± {ci:.2f} (2) | 99.00 (1) | 2.50 ± {ci:.2f} (2) | 1.00 (1) |" in text
    assert "### How well each method knows its errors\n" in text
    # Units-ML - MAML seed by seed: 4 points behind on the surest half in both seeds (seed 1 alone by probability).
    paired = "| -4.00 ± 0.00 (2) | -4.00 (1) | +0.00 ± 0.00 (2) | +0.00 (1) | +0.00 ± 0.00 (2) |"
    assert f"| omniglot_5w1s | Units-ML - MAML, paired by seed {paired}" in text
    assert "Units-ML - Units-NTS, paired by seed |" not in text  # Units-NTS did not run


def test_the_budget_tables_say_how_well_each_method_knows_its_errors_at_the_full_budget(tmp_path):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    (run,) = _grid(options.root, seeds=(0,), methods=("Units-ML",))
    for name in ("labels-04000", "labels-08000"):
        _finish_test(run, name, 0.9)
    results = _results(0.95)
    results.update(selective_accuracy=[{"coverage": 0.5, "accuracy": 0.99}], aurc=0.005, ece=0.17)
    results.update(selective_accuracy_max_probability=[{"coverage": 0.5, "accuracy": 1.0}], aurc_max_probability=0.001)
    folders.write_json(run.folder / "test" / "labels-10000" / "results.json", results)
    _finish_fit(run, options)
    folders.write_json(run.folder / folders.DONE, {"finished": "now"})
    written = report.write_tables([run], tmp_path / "tables")
    errors = json.loads(written["json"].read_text())["budget_error_ranking"]["budget_omniglot_5w1s"]["Units-ML"]
    assert errors["labels"] == 10000 and errors["error_ranking"]["aurc_max_probability"]["mean"] == pytest.approx(0.1)
    text = written["markdown"].read_text()
    assert "### How well each method knows its errors at 10,000 labeled query sets" in text
    assert "| budget_omniglot_5w1s | Units-ML | 99.00 (1) | 100.00 (1) | 0.50 (1) | 0.10 (1) | 17.00 (1) |" in text


def test_no_paired_row_without_both_methods(tmp_path):
    (tmp_path / "data" / "omniglot").mkdir(parents=True)
    options = _options(tmp_path / "root", tmp_path / "data")
    (run,) = _grid(options.root, seeds=(0,), methods=("Units-ML",))
    for name in ("labels-04000", "labels-08000", "labels-10000"):
        _finish_test(run, name, 0.9)
    _finish_fit(run, options)
    folders.write_json(run.folder / folders.DONE, {"finished": "now"})
    written = report.write_tables([run], tmp_path / "tables")
    assert json.loads(written["json"].read_text())["paired"] == {}
    assert "paired by seed" not in written["markdown"].read_text()

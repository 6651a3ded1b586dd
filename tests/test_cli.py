"""The command line: a fit smoke test, a custom sampler plugged in from YAML, a real offline W&B run, what a person
sees (one line per validation, the files written, `--help`), and one folder per run that `test`, `predict` and
`--ckpt_path last` / `best` find again."""

import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART

from units_lightning.callbacks import ValidationProgress
from units_lightning.cli import COMMANDS, cli_main, main
from units_lightning.dashboard.run_log import wandb_parts
from units_lightning.dashboard.wandb_offline import find_offline_runs, read_history
from units_lightning.samplers import TaskSampler

FAST = [*TINY_QUICKSTART, "--trainer.limit_train_batches=3"]  # the quick start in seconds: 6 steps


class LeastUncertainSampler(TaskSampler):
    """A user's sampler: draws tasks from classes close in id (harder tasks) and keeps the LEAST uncertain set."""

    instances = []

    def __init__(self, tasks: int = 2, query_sets: int = 3, spread: int = 8):
        super().__init__(tasks=tasks, query_sets=query_sets)
        self.spread = spread
        self.selections = 0
        LeastUncertainSampler.instances.append(self)

    def draw_classes(self, rng, step):
        first = rng.integers(0, len(self._pools) - self.spread)
        return first + rng.choice(self.spread, size=self.spec.n_way, replace=False)

    def choose(self, scores):
        self.selections += 1
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask[torch.arange(scores.shape[0]), scores.argmin(dim=1)] = True
        return mask


def run_cli(*args):
    return cli_main(["fit", "--config", str(QUICKSTART), *FAST, *args])


def test_fit_smoke_writes_checkpoint_and_summary(tmp_path, capsys):
    cli = run_cli(
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
    )
    log_dir = Path(cli.trainer.log_dir)
    assert log_dir.is_relative_to(tmp_path)
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["steps"] == 6
    assert 0.0 <= summary["val_accuracy"] <= 1.0
    for key in ("val_vacuity", "val_dissonance", "val_incorrect_belief", "wall_time_s"):
        assert summary[key] is not None
    assert summary["labels"]["query_sets"] == 6 * 4
    assert "units-lightning fit summary" in capsys.readouterr().out
    (checkpoint,) = (log_dir / "checkpoints").glob("step*.ckpt")  # the best by val/acc, beside last.ckpt
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()
    assert cli.model.sampler is cli.datamodule.sampler
    for subcommand in ("validate", "test"):
        evaluated = cli_main(
            [
                subcommand,
                "--config",
                str(QUICKSTART),
                *FAST[3:],
                "--data.test_tasks=4",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
                f"--ckpt_path={checkpoint}",
            ]
        )
        prefix = "val" if subcommand == "validate" else "test"
        assert 0.0 <= float(evaluated.trainer.callback_metrics[f"{prefix}/acc"]) <= 1.0
        assert evaluated.model.ledger.query_sets == 6 * 4  # restored from the checkpoint


def test_custom_sampler_from_yaml_trains(tmp_path):
    config = {
        "data": {
            "class_path": "units_lightning.data.SyntheticGlyphsDataModule",
            "init_args": {
                "sampler": {
                    "class_path": f"{__name__}.LeastUncertainSampler",
                    "init_args": {"tasks": 2, "query_sets": 3, "spread": 6},
                }
            },
        },
        "trainer": {"logger": False, "default_root_dir": str(tmp_path), "callbacks": [], "enable_checkpointing": False},
    }
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(config))
    LeastUncertainSampler.instances.clear()
    cli = run_cli("--config", str(path))
    sampler = cli.datamodule.sampler
    assert type(sampler).__name__ == "LeastUncertainSampler" and sampler.spread == 6
    assert cli.model.sampler is sampler
    assert sampler.selections == 6
    assert cli.model.ledger.query_sets == 6 * 2
    assert cli.trainer.global_step == 6


def test_bad_sampler_argument_is_rejected_by_the_config_parser(tmp_path):
    with pytest.raises(SystemExit):
        run_cli("--data.sampler.init_args.tasks=many", f"--trainer.default_root_dir={tmp_path}")


def test_real_offline_wandb_run_holds_the_belief_keys(tmp_path):
    cli = run_cli(f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.default_root_dir={tmp_path}")
    cli.trainer.logger.experiment.finish()  # what the process exit does for a command-line run: flush to disk
    (run,) = find_offline_runs(tmp_path)
    expected = {
        "train/loss_step",
        "train/acc_step",
        "train/vacuity_step",
        "train/dissonance_step",
        "train/incorrect_belief_step",
        "train/correct_belief_step",
        "train/vacuity_epoch",
        "val/acc",
        "val/vacuity",
        "val/dissonance",
        "val/incorrect_belief",
        "val/correct_belief",
        "schedule/lambda",
        "schedule/eta",
        "labels/query_sets",
        "labels/query_images",
        "labels/support_images",
        "selection/uncertainty_chosen_step",
    }
    # wandb's service may still be writing the file when finish() returns (seen under load: no rows read yet).
    deadline = time.monotonic() + 60
    while True:
        rows = read_history(run)
        keys = set().union(*rows)
        if expected <= keys or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert expected <= keys, expected - keys
    vacuity = [row["train/vacuity_step"] for row in rows if "train/vacuity_step" in row]
    assert all(0.0 < v <= 1.0 for v in vacuity)
    query_sets = [row["labels/query_sets"] for row in rows if "labels/query_sets" in row]
    assert query_sets == sorted(query_sets) and query_sets[-1] == 6 * 4
    run_folder = tmp_path / "units-lightning" / run.name.rsplit("-", 1)[-1]  # beside its checkpoints
    summary = json.loads((run_folder / "summary.json").read_text())
    assert summary["steps"] == 6 and (run_folder / "config.yaml").is_file()
    assert summary["checkpoints"]["last"] == "checkpoints/last.ckpt"


def test_console_script_and_module_entry_points_print_help():
    for command in (["units-lightning"], [sys.executable, "-m", "units_lightning"]):
        if command[0] == "units-lightning":
            command = (
                [str(REPO / ".venv" / "bin" / "units-lightning")]
                if (REPO / ".venv" / "bin" / "units-lightning").exists()
                else command
            )
        done = subprocess.run([*command, "fit", "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "--data CONFIG | CLASS_PATH_OR_NAME | .INIT_ARGS.NAME VALUE" in done.stdout or "--data" in done.stdout
        assert "--model.inner_steps" in done.stdout


@pytest.mark.parametrize("config", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["inference_mode"] is False
    assert printed["trainer"]["logger"]["init_args"]["offline"] is True


class NeighbourSampler(TaskSampler):
    """The README's custom sampler in short: its own warm-up default is 0."""

    def __init__(self, tasks: int = 4, query_sets: int = 4, spread: int = 10, warmup_steps: int = 0):
        super().__init__(tasks=tasks, query_sets=query_sets, warmup_steps=warmup_steps)
        self.spread = spread


def test_a_sampler_given_in_a_config_file_starts_from_its_own_defaults(tmp_path, capsys):
    path = tmp_path / "sampler.yaml"
    spec = {"class_path": f"{__name__}.NeighbourSampler", "init_args": {"tasks": 4, "spread": 6}}
    path.write_text(yaml.safe_dump({"data": {"init_args": {"sampler": spec}}}))
    fast = [f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.fast_dev_run=true"]
    cli = run_cli("--config", str(path), *fast)
    sampler = cli.datamodule.sampler
    assert (sampler.warmup_steps, sampler.spread, sampler.tasks, sampler.query_sets) == (0, 6, 4, 4)
    assert "NeighbourSampler takes its own default warmup_steps=0, not 50" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", str(QUICKSTART), "--config", str(path), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)  # --print_config shows the config the command runs
    assert printed["data"]["init_args"]["sampler"]["init_args"]["warmup_steps"] == 0
    assert printed["trainer"]["logger"]["init_args"]["save_dir"] == printed["trainer"]["default_root_dir"]
    # On the command line a class keeps the arguments it shares with the one it replaces (jsonargparse's rule),
    # and the command says so.
    cli = run_cli(f"--data.sampler={__name__}.NeighbourSampler", *fast)
    assert cli.datamodule.sampler.warmup_steps == 50
    assert "NeighbourSampler keeps warmup_steps=50 from units_lightning.samplers.MultiQuerySampler" in (
        capsys.readouterr().err
    )


def test_the_console_script_imports_a_class_from_the_working_folder(tmp_path):
    (tmp_path / "my_lab").mkdir()
    (tmp_path / "my_lab" / "samplers.py").write_text(
        "from units_lightning.samplers import TaskSampler\n\n\nclass Mine(TaskSampler):\n    pass\n"
    )
    (tmp_path / "mine.yaml").write_text("data:\n  init_args:\n    sampler:\n      class_path: my_lab.samplers.Mine\n")
    script = REPO / ".venv" / "bin" / "units-lightning"
    command = (
        [str(script)] if script.exists() else [sys.executable, "-c", "from units_lightning.cli import main; main()"]
    )
    done = subprocess.run(
        [*command, "fit", "--config", str(QUICKSTART), "--config", "mine.yaml", "--print_config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "class_path: my_lab.samplers.Mine" in done.stdout


def test_help_lists_every_command_on_one_line(capsys):
    main(["--help"])
    printed = capsys.readouterr().out
    for command, text in COMMANDS.items():
        assert f"  {command:<9}  {text}" in printed
    with pytest.raises(SystemExit) as exit_info:
        main(["fitt"])
    assert exit_info.value.code == 2 and "Did you mean `units-lightning fit`?" in capsys.readouterr().err


def test_select_and_ingest_are_dispatched_to_the_annotation_commands(monkeypatch, capsys):
    import types

    calls = []
    fake = types.ModuleType("units_lightning.annotation.commands")
    fake.select_main = lambda argv: calls.append(("select", argv))
    fake.ingest_main = lambda argv: calls.append(("ingest", argv))
    monkeypatch.setitem(sys.modules, "units_lightning.annotation.commands", fake)
    main(["select", "--round", "1"])
    main(["ingest"])
    assert calls == [("select", ["--round", "1"]), ("ingest", [])]
    monkeypatch.setitem(sys.modules, "units_lightning.annotation.commands", None)  # an installation without it
    with pytest.raises(SystemExit, match="not available in this installation"):
        main(["select"])
    main(["--help"])  # the other commands are unaffected
    assert "select" in capsys.readouterr().out


def test_the_output_is_one_line_per_validation_then_the_files_written(tmp_path, capsys):
    run_cli(
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=true",
        "--trainer.limit_train_batches=3",
    )
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0] for line in lines] == ["step 3/6", "step 6/6"]
    assert all(" val acc " in line and " vacuity " in line and " dissonance " in line for line in lines)
    assert "it/s" not in out and "Epoch 0" not in out  # no progress bar redraws
    written = out[out.index(f"written to {tmp_path}") :]
    assert (
        "checkpoints/last.ckpt" in written and "--ckpt_path best" in written and "summary.json, config.yaml" in written
    )
    assert f"units-lightning report {tmp_path}" in written


def test_without_validation_the_next_command_tests_the_last_checkpoint_which_exists(tmp_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cli(
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=0",
        )
    assert not [w for w in caught if "could not find the monitored key" in str(w.message)]  # Lightning's, per epoch
    out = capsys.readouterr().out
    assert "validation is off (--trainer.limit_val_batches 0): no checkpoint is kept by val/acc\n" in out
    written = out.split(f"written to {tmp_path}")[1]
    assert "best by val/acc" not in written
    (next_test,) = [line for line in written.splitlines() if line.startswith("next: units-lightning test ")]
    assert next_test.endswith(" --ckpt_path last") and (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_progress_steps_brings_back_lightnings_bar(tmp_path):
    common = [f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.fast_dev_run=true"]
    cli = run_cli(*common, "--trainer.enable_progress_bar=true", "--progress=steps")
    assert not isinstance(cli.trainer.progress_bar_callback, ValidationProgress)
    assert cli.trainer.progress_bar_callback is not None
    cli = run_cli(*common, "--trainer.enable_progress_bar=true")
    assert isinstance(cli.trainer.progress_bar_callback, ValidationProgress)


def test_test_predict_and_resume_find_the_runs_folder(tmp_path, capsys):
    """The README's order in miniature: fit (W&B), test --ckpt_path best, predict, fit --ckpt_path last."""
    root = [f"--trainer.default_root_dir={tmp_path}"]  # the W&B logger writes there too
    cli = run_cli(*root)
    cli.trainer.logger.experiment.finish()
    (folder,) = (tmp_path / "units-lightning").iterdir()
    trained_config = (folder / "config.yaml").read_text()
    summary = (folder / "summary.json").read_text()
    tested = cli_main(["test", "--config", str(QUICKSTART), *FAST, *root, "--data.test_tasks=2", "--ckpt_path=best"])
    tested.trainer.logger.experiment.finish()
    printed = capsys.readouterr().out
    assert (
        f"--ckpt_path best: using {folder / 'checkpoints'}" in printed
        and f"continuing W&B run {folder.name}" in printed
    )
    assert (folder / "results.json").is_file() and (folder / "config_test.yaml").is_file()
    assert (folder / "config.yaml").read_text() == trained_config
    assert len(wandb_parts(folder)) == 2  # the test's rows went on in the training's W&B run
    images = tmp_path / "task"
    glyphs = __import__("units_lightning.data.datasets.synthetic", fromlist=["SyntheticGlyphs"])
    drawn = glyphs.SyntheticGlyphs("test", num_classes=5, images_per_class=2, image_size=16)
    from PIL import Image

    for index in range(10):
        name = drawn.class_names[index // 2]
        target = images / ("support" if index % 2 == 0 else "query") / (name if index % 2 == 0 else "") / f"{index}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(drawn.gather([index])[0, 0].mul(255).byte().numpy()).save(target)
    cli_main(
        [
            "predict",
            "--config",
            str(QUICKSTART),
            *FAST,
            *root,
            "--ckpt_path=best",
            "--data=units_lightning.data.FolderPredictionDataModule",
            f"--data.support={images / 'support'}",
            f"--data.query={images / 'query'}",
            "--data.image_size=16",
        ]
    )
    assert (folder / "predictions.csv").is_file()
    assert len(find_offline_runs(tmp_path)) == 2  # predict logs nothing and opened no W&B run
    resumed = cli_main(["fit", "--config", str(QUICKSTART), *FAST, *root, "--ckpt_path=last"])
    resumed.trainer.logger.experiment.finish()
    assert "nothing to train:" in capsys.readouterr().out
    assert (folder / "summary.json").read_text() == summary
    assert len(find_offline_runs(tmp_path)) == 2  # nor did a resume with nothing to train


def test_the_wandb_logger_writes_under_default_root_dir_when_built_without_a_subcommand(tmp_path):
    # run=False is how benchmarks/fit.py and benchmarks/scaling.py build a trainer (`fit`: see --print_config above)
    cli = cli_main(["--config", str(QUICKSTART), *FAST, f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.trainer.logger.save_dir == str(tmp_path)  # not the working folder


def test_strategy_ddp_is_lightnings_built_on_the_training_stream(tmp_path):
    from units_lightning.strategies import DDPStrategy

    cli = cli_main(
        [
            "--config",
            str(QUICKSTART),
            *FAST,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.accelerator=cpu",
            "--trainer.strategy=ddp",
        ],
        run=False,
    )
    assert type(cli.trainer.strategy) is DDPStrategy  # not Lightning's, whose side stream draws a warning per backward
    other = cli_main(
        [
            "--config",
            str(QUICKSTART),
            *FAST,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.accelerator=cpu",
            "--trainer.strategy=ddp_spawn",
        ],
        run=False,
    )
    assert type(other.trainer.strategy) is not DDPStrategy  # only "ddp" itself is mapped

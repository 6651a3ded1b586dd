"""The command line: a fit smoke test, a custom sampler plugged in from YAML, and a real offline W&B run."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART

from units_lightning.cli import cli_main
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
    summary = json.loads((run / "files" / "summary.json").read_text())
    assert summary["steps"] == 6


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

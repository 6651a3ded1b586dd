"""``benchmarks/scaling.py``: the options of each measured run, the table, and (slow) a CPU run on 1 and 2 processes."""

import json
import os
import subprocess
import sys

import pytest
from tiny_setup import REPO

from benchmarks import scaling


def test_each_run_is_the_config_on_n_devices_with_validation_off():
    args = scaling.parse(["--accelerator", "cpu", "--steps", "20", "--skip", "5", "--extra", "--model.filters=8"])
    config = {"data": {"class_path": "units_lightning.data.OmniglotDataModule"}, "trainer": {}}
    one = scaling.fit_arguments("omniglot_20w1s", config, REPO / "omniglot", 1, args, REPO / "out")
    two = scaling.fit_arguments("omniglot_20w1s", config, REPO / "omniglot", 2, args, REPO / "out")
    pairs = dict(zip(two[::2], two[1::2], strict=False))
    assert pairs["--trainer.devices"] == "2" and pairs["--trainer.strategy"] == "ddp"
    assert pairs["--trainer.limit_val_batches"] == "0" and pairs["--trainer.num_sanity_val_steps"] == "0"
    assert pairs["--data.init_args.sampler.init_args.warmup_steps"] == "0"
    assert "--trainer.strategy" not in one, "one device keeps the config's strategy"
    assert two[-1] == "--model.filters=8"  # the extra options come last, so they win


def test_speedups_are_over_the_single_device_row_of_the_same_config():
    rows = [
        {"config": "a", "devices": 1, "tasks_per_rank": 8, "tasks_per_step": 8, "tasks_per_s": 100.0},
        {"config": "a", "devices": 2, "tasks_per_rank": 8, "tasks_per_step": 16, "tasks_per_s": 190.0},
        {"config": "b", "devices": 2, "tasks_per_rank": 4, "tasks_per_step": 8, "tasks_per_s": 50.0},
        {"config": "b", "devices": 4, "skipped": "2 GPUs here"},
    ]
    scaling.add_speedups(rows)
    assert [r.get("speedup") for r in rows] == [1.0, 1.9, None, None]
    table = scaling.table(rows).splitlines()
    assert table[2] == "| a | 1 | 8 (8 x 1) | 100.0 | 1.00x |"
    assert table[3] == "| a | 2 | 16 (8 x 2) | 190.0 | 1.90x |"
    assert table[4] == "| b | 2 | 8 (4 x 2) | 50.0 | - |" and "2 GPUs here" in table[5]


def test_nothing_timed_is_refused():
    with pytest.raises(SystemExit):
        scaling.parse(["--steps", "10", "--skip", "10"])


@pytest.mark.slow
def test_cpu_run_on_one_and_two_processes(tmp_path):
    tiny = ["--model.filters=4", "--model.inner_steps=1", "--data.image_size=16", "--data.train_classes=40"]
    tiny += ["--data.eval_classes=10", "--data.images_per_class=12"]
    command = [sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--accelerator", "cpu", "--devices", "1", "2"]
    command += ["--configs", "quickstart", "--steps", "5", "--skip", "2", "--out", str(tmp_path / "runs")]
    command += ["--json", str(tmp_path / "rows.json"), "--timeout", "280", "--extra", *tiny]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [(r["devices"], r["tasks_per_step"], r["timed_steps"]) for r in rows] == [(1, 4, 3), (2, 8, 3)], rows
    assert rows[0]["speedup"] == 1.0 and rows[1]["tasks_per_s"] > 0 and len(rows[1]["seconds_per_rank"]) == 2
    # Every step of every rank labels one query set per task (warm-up off): the ledger counts both ranks.
    assert [r["labeled_query_sets"] for r in rows] == [5 * 4, 5 * 4 * 2]
    assert "| quickstart | 2 | 8 (4 x 2) |" in done.stdout

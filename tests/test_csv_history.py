"""A CSV-logged run keeps every fit segment's metrics: the files (``units_lightning.csv_history``), the callback
that copies them (``CSVHistory``), and a real fit killed and resumed with ``--ckpt_path last``."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from tiny_setup import QUICKSTART, TINY_QUICKSTART, tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import CSVHistory
from units_lightning.csv_history import (
    current_metrics,
    history_files,
    keep_metrics,
    log_metrics,
    next_segment,
    read_metrics,
    run_metrics,
    save_segment,
    saved_segments,
    stitch_metrics,
)
from units_lightning.dashboard.run_log import read_log, read_run_log
from units_lightning.samplers import RandomSampler

TESTS = Path(__file__).resolve().parent


def _write_csv(path: Path, header: str, *rows: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _trained(row) -> bool:
    """A row of a training step's values (``train/<name>_step``; not the epoch means, logged at an epoch's end)."""
    return any(k.startswith("train/") and k.endswith("_step") and v not in ("", None) for k, v in row.items())


def test_a_resumed_segment_supersedes_the_rows_from_its_first_step_on():
    first = [
        {"step": "0", "train/loss": "2.0"},
        {"step": "49", "val/acc": "0.4"},
        {"step": "99", "val/acc": "0.5"},
        {"step": "120", "train/loss": "1.0"},
    ]
    # Resumed from its checkpoint at step 99: the first segment's 99 and 120 are superseded; a new column.
    second = [{"step": "99", "val/acc": "0.52", "val/vacuity": "0.3"}, {"step": "149", "val/acc": "0.6"}]
    third = [{"step": "200", "val/acc": "0.7"}]  # resumed after the last step logged: nothing superseded
    assert stitch_metrics([first, second, [], third]) == [*first[:2], *second, *third]
    assert stitch_metrics([first]) == first and stitch_metrics([]) == []
    # A segment starting at step 0 (a fit started afresh) supersedes everything before it.
    assert stitch_metrics([first, second, [{"step": "0", "val/acc": "0.1"}]]) == [{"step": "0", "val/acc": "0.1"}]
    # A copy of a segment, then the segment itself (longer): the segment's rows, once.
    assert stitch_metrics([first, second[:1], second]) == [*first[:2], *second]


def test_metrics_set_aside_follow_every_segment_saved_before_oldest_first(tmp_path):
    folder = tmp_path / "run"
    _write_csv(folder / "metrics" / "segment-00.csv", "step,val/acc", "1,0.1")
    newer = _write_csv(folder / "logs" / "version_0" / "metrics.csv", "step,val/acc", "2,0.2")
    older = _write_csv(folder / "logs" / "version_1" / "metrics.csv", "step,val/acc", "0,0.3")
    _write_csv(folder / "test" / "top1" / "metrics.csv", "step,val/acc", "0,0.0")  # a test's, not the fit's
    os.utime(older, ns=(1_000_000_000, 1_000_000_000))
    assert current_metrics(folder) == [older, newer]
    assert keep_metrics(folder) == [folder / "metrics" / "segment-01.csv", folder / "metrics" / "segment-02.csv"]
    assert [p.read_text().splitlines()[1] for p in saved_segments(folder)] == ["1,0.1", "0,0.3", "2,0.2"]
    assert current_metrics(folder) == [] and keep_metrics(folder) == []  # nothing new: nothing moved
    # A caller that counts its segments names the next one; never below those saved.
    _write_csv(folder / "logs" / "version_1" / "metrics.csv", "step,val/acc", "3,0.4")
    assert keep_metrics(folder, first_index=7) == [folder / "metrics" / "segment-07.csv"]
    assert next_segment(folder) == 8


def test_the_history_is_the_saved_segments_in_order_then_the_current_metrics(tmp_path):
    folder = tmp_path / "run"
    _write_csv(folder / "metrics" / "segment-100.csv", "epoch,step,val/acc,val/vacuity", "1,30,0.7,", "1,40,,0.2")
    _write_csv(folder / "metrics" / "segment-99.csv", "step,val/acc", "10,0.5", "20,0.6", "35,0.65")
    (folder / "metrics" / "notes.txt").write_text("not a segment")
    _write_csv(folder / "logs" / "version_0" / "metrics.csv", "step,val/acc", "40,0.8")
    _write_csv(folder / "test" / "top1-val" / "metrics.csv", "step,val/acc", "0,0.0")  # not the fit's
    assert run_metrics(folder) == [
        {"step": "10", "val/acc": "0.5"},
        {"step": "20", "val/acc": "0.6"},
        {"epoch": "1", "step": "30", "val/acc": "0.7", "val/vacuity": ""},
        {"step": "40", "val/acc": "0.8"},
    ]


def test_a_log_folder_reads_its_segments_then_its_metrics_csv_as_the_report_does(tmp_path):
    log = tmp_path / "lightning_logs" / "version_0"
    current = _write_csv(log / "metrics.csv", "step,train/loss,val/acc", "0,2.0,", "1,1.5,", "2,1.2,0.4")
    assert save_segment(log, 0) == log / "metrics" / "segment-00.csv"  # the copy made at a checkpoint
    assert save_segment(tmp_path, 0) is None and not (tmp_path / "metrics").exists()  # no metrics.csv: nothing
    _write_csv(current, "step,train/loss,val/acc", "2,1.1,", "3,1.0,0.5")  # the resumed fit's, from step 2
    assert history_files(log) == [log / "metrics" / "segment-00.csv", current]
    assert [row["step"] for row in log_metrics(log)] == ["0", "1", "2", "3"]
    for read in (read_run_log(log), read_log(log), read_log(current)):
        assert [(row["step"], row.get("train/loss")) for row in read.rows] == [(0, 2.0), (1, 1.5), (2, 1.1), (3, 1.0)]
    current.unlink()  # a resume that stopped before it logged a row: the segments are the history
    assert [row["step"] for row in read_run_log(log).rows] == [0.0, 1.0, 2.0]
    assert not list(log.glob("metrics/.*tmp*"))  # written through a temporary file, renamed


def test_the_callback_copies_the_log_of_each_fit_into_a_segment_of_its_own(tmp_path):
    def fit(max_steps: int, ckpt_path: str | None, callbacks: list) -> CSVLogger:
        logger = CSVLogger(tmp_path, version=0)
        trainer = tiny_trainer(tmp_path, max_steps=max_steps, logger=logger, callbacks=callbacks, log_every_n_steps=1)
        data = tiny_data(RandomSampler())
        trainer.fit(tiny_model(sampler=data.sampler), data, ckpt_path=ckpt_path)
        trainer.save_checkpoint(tmp_path / "stop.ckpt")
        return logger

    logger = fit(3, None, [CSVHistory(), CSVHistory()])  # two of them: one copy, by the first
    folder = Path(logger.log_dir)
    assert [p.name for p in saved_segments(folder)] == ["segment-00.csv"]
    assert read_metrics(folder / "metrics" / "segment-00.csv") == read_metrics(folder / "metrics.csv")
    fit(5, str(tmp_path / "stop.ckpt"), [CSVHistory()])
    assert [p.name for p in saved_segments(folder)] == ["segment-00.csv", "segment-01.csv"]
    train_steps = [int(row["step"]) for row in log_metrics(folder) if _trained(row)]
    assert train_steps == list(range(5))  # the first fit's three and the resumed fit's two, each once
    assert [int(r["step"]) for r in read_metrics(folder / "metrics.csv") if _trained(r)] == [3, 4]


# --- a real run, killed and resumed -----------------------------------------------------------------------------

# The quick start shrunk to 12 steps, validated (and checkpointed) every 3 steps, logged with CSVLogger.
TINY = [
    *TINY_QUICKSTART,
    "--trainer.limit_train_batches=6",
    "--trainer.val_check_interval=3",
    "--trainer.enable_model_summary=false",
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
]
KILL_AT = 11  # last.ckpt holds step 9 then


@pytest.mark.slow
def test_a_csv_logged_fit_killed_then_resumed_keeps_every_steps_metrics(tmp_path, capsys):
    from units_lightning.cli import cli_main

    args = ["fit", "--config", str(QUICKSTART), *TINY, f"--trainer.default_root_dir={tmp_path}"]
    args.append(f"--trainer.logger.init_args.save_dir={tmp_path}")
    kill = f'{{"class_path": "tiny_setup.SigkillAtStep", "init_args": {{"step": {KILL_AT}}}}}'
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    killed = subprocess.run(
        [sys.executable, "-m", "units_lightning", *args, f"--trainer.callbacks+={kill}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    (checkpoint,) = tmp_path.glob("*/version_0/checkpoints/last.ckpt")  # the logger's name is the config's
    assert torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"] == 9
    folder = checkpoint.parent.parent

    cli = cli_main([*args, "--ckpt_path=last"])
    assert "continuing CSVLogger version 0" in capsys.readouterr().out
    assert Path(cli.trainer.log_dir) == folder and cli.trainer.global_step == 12

    log = read_run_log(folder)  # what `units-lightning report` reads
    train = [int(row["step"]) for row in log.rows if _trained(row)]
    validated = [int(row["step"]) for row in log.rows if "val/acc" in row]
    assert train == sorted(set(train)) and len(train) == 12, train  # every training step, once
    assert len(validated) == 4 and validated == sorted(set(validated)), validated  # every validation: 4 of them
    # Without the kept segment, the resumed fit's metrics.csv (Lightning deleted the one before) starts at step 9.
    resumed = [int(float(r["step"])) for r in read_metrics(folder / "metrics.csv") if _trained(r)]
    assert len(resumed) < len(train) and min(resumed) > min(train)

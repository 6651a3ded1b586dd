"""``SummaryWriter``: ``trainer.fit`` from Python writes the ``summary.json`` that ``units-lightning fit`` writes."""

import json
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from tiny_setup import QUICKSTART, TINY_QUICKSTART, tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import SummaryWriter
from units_lightning.cli import cli_main
from units_lightning.samplers import RandomSampler


def _python_fit(folder: Path, callbacks: list, max_steps: int = 2, ckpt_path: str | None = None):
    data = tiny_data(RandomSampler())
    trainer = tiny_trainer(
        folder,
        max_steps=max_steps,
        limit_val_batches=1,
        val_check_interval=2,
        enable_checkpointing=True,
        callbacks=[*callbacks, ModelCheckpoint(dirpath=folder / "checkpoints", filename="last")],
    )
    trainer.fit(tiny_model(sampler=data.sampler), data, ckpt_path=ckpt_path)
    return trainer


def test_a_python_fit_writes_the_summary_the_command_line_writes(tmp_path, capsys):
    first, second = SummaryWriter(), SummaryWriter(output_dir=str(tmp_path / "elsewhere"))
    _python_fit(tmp_path / "python", [first, second])  # twice in one trainer: the first writes, once
    written = json.loads((tmp_path / "python" / "summary.json").read_text())
    assert first.summary == written and first.path == tmp_path / "python" / "summary.json"
    assert second.summary is None and not (tmp_path / "elsewhere").exists()
    assert written["steps"] == 2 and written["start_step"] == 0 and written["val_accuracy"] is not None
    assert written["checkpoints"] == {"last": "checkpoints/last.ckpt"}
    assert "units-lightning fit summary" not in capsys.readouterr().out  # from Python it writes, printing nothing

    cli = cli_main(
        ["fit", "--config", str(QUICKSTART), *TINY_QUICKSTART, "--trainer.limit_train_batches=3"]
        + [f"--trainer.default_root_dir={tmp_path / 'cli'}", "--trainer.logger=false"]
    )
    from_cli = json.loads((Path(cli.trainer.default_root_dir) / "summary.json").read_text())
    assert written.keys() == from_cli.keys() and written["labels"].keys() == from_cli["labels"].keys()
    assert [type(c) for c in cli.trainer.callbacks].count(SummaryWriter) == 1


def test_a_resumed_fit_counts_its_steps_from_the_checkpoint_and_one_with_nothing_to_train_writes_nothing(tmp_path):
    folder = tmp_path / "run"
    _python_fit(folder, [SummaryWriter()], max_steps=2)
    last = str(folder / "checkpoints" / "last.ckpt")
    writer = SummaryWriter()
    _python_fit(folder, [writer], max_steps=4, ckpt_path=last).save_checkpoint(tmp_path / "step4.ckpt")
    resumed = json.loads((folder / "summary.json").read_text())
    assert resumed["steps"] == 4 and resumed["start_step"] == 2 and writer.summary == resumed
    idle = SummaryWriter()
    _python_fit(folder, [idle], max_steps=4, ckpt_path=str(tmp_path / "step4.ckpt"))
    assert idle.summary is None and json.loads((folder / "summary.json").read_text()) == resumed


def test_a_plain_python_fit_gets_the_writers_from_the_model(tmp_path):
    """No callback given: ``UnitsMAML.configure_callbacks`` adds ``SummaryWriter`` and ``CSVHistory`` (the
    command line's own are then the only ones), so ``trainer.fit`` from Python writes ``summary.json``."""
    from lightning.pytorch.loggers import CSVLogger

    from units_lightning.callbacks import CSVHistory

    data = tiny_data(RandomSampler())
    folder = tmp_path / "plain"
    trainer = tiny_trainer(
        folder, max_steps=2, limit_val_batches=1, val_check_interval=2, logger=CSVLogger(folder, name="csv")
    )
    trainer.fit(tiny_model(sampler=data.sampler), data)
    assert [type(c) for c in trainer.callbacks].count(SummaryWriter) == 1
    assert [type(c) for c in trainer.callbacks].count(CSVHistory) == 1
    run = folder / "csv" / "version_0"  # the logger's run folder
    written = json.loads((run / "summary.json").read_text())
    assert written["steps"] == 2 and "collapse_diagnosis" in written
    assert (run / "metrics" / "segment-00.csv").is_file()  # CSVHistory kept the segment
    own = SummaryWriter(output_dir=str(tmp_path / "mine"))
    trainer = tiny_trainer(tmp_path / "kept", max_steps=1, limit_val_batches=0, callbacks=[own])
    trainer.fit(tiny_model(sampler=data.sampler), data)
    assert own.path == tmp_path / "mine" / "summary.json"  # a user's writer is kept, not replaced by the model's

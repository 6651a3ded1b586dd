"""Resume: a run killed with SIGKILL continues with `--ckpt_path last` to the parameters of an uninterrupted run,
in the same W&B run; checkpoints are written atomically; every shipped config keeps a last.ckpt."""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART

from units_lightning.resume import RUN_KEY, AtomicCheckpointIO, best_checkpoint, find_last_checkpoint, stored_run

TESTS = Path(__file__).resolve().parent
# The quick start shrunk to 12 steps, validated (and checkpointed) every 3 steps, so step 9 is mid-epoch.
TINY = [
    *TINY_QUICKSTART,
    "--trainer.limit_train_batches=6",
    "--trainer.val_check_interval=3",
    "--trainer.enable_model_summary=false",
    "--data.sampler.init_args.warmup_steps=2",  # task selection (scores, chosen sets) from step 2 on
]
KILL_AT = 11  # last.ckpt holds step 9 then: steps 10 and 11 are lost and done again


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    # The thread count of this process, so that the steps done here and in a subprocess are the same sums.
    threads = str(torch.get_num_threads())
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": threads, "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)  # a W&B service of its own: this process's would outlive the kill
    return env


def _args(root: Path, *args: str) -> list[str]:
    return ["fit", "--config", str(QUICKSTART), *TINY, f"--trainer.default_root_dir={root}", *args]


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _tensors(optimizer_state: dict) -> list[torch.Tensor]:
    return [v for state in optimizer_state["state"].values() for v in state.values() if torch.is_tensor(v)]


def test_sigkill_halfway_then_ckpt_path_last_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, capsys):
    from units_lightning.cli import cli_main
    from units_lightning.dashboard import find_offline_runs, read_history

    reference, run = tmp_path / "reference", tmp_path / "run"
    # The run that is killed: the command line in its own process, with the quick start's offline W&B logger.
    kill = f'{{"class_path": "tiny_setup.SigkillAtStep", "init_args": {{"step": {KILL_AT}}}}}'
    command = [sys.executable, "-m", "units_lightning", *_args(run, f"--trainer.logger.init_args.save_dir={run}")]
    killed = subprocess.Popen(
        [*command, f"--trainer.callbacks+={kill}"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Meanwhile the uninterrupted run of the same seed, started with `--ckpt_path last` where there is no
    # checkpoint yet ("set and forget": it starts a new run and says so).
    cli_main(_args(reference, "--trainer.logger=false", "--ckpt_path=last"))
    printed = capsys.readouterr().out
    assert "--ckpt_path last: no last.ckpt in" in printed and "starting a new run" in printed
    output, _ = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, output

    (checkpoint,) = run.glob("units-lightning/*/checkpoints/last.ckpt")
    run_id = checkpoint.parent.parent.name
    at_kill = _load(checkpoint)
    assert at_kill["global_step"] == 9 and at_kill[RUN_KEY] == {"logger": "WandbLogger", "version": run_id}
    assert not list(checkpoint.parent.glob(".*tmp*"))

    # The same command again, with `--ckpt_path last`.
    cli = cli_main(_args(run, f"--trainer.logger.init_args.save_dir={run}", "--ckpt_path=last"))
    cli.trainer.logger.experiment.finish()  # what the process exit does for a command-line run: flush to disk
    printed = capsys.readouterr()
    assert f"resuming from {checkpoint} (step 9, continuing W&B run {run_id})" in printed.out
    assert "no last checkpoint available" not in printed.out + printed.err
    assert cli.trainer.logger.version == run_id
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)

    expected, resumed = _load(reference / "checkpoints" / "last.ckpt"), _load(checkpoint)
    assert resumed["global_step"] == expected["global_step"] == 12
    assert resumed["state_dict"].keys() == expected["state_dict"].keys()
    changed = 0
    for name, value in expected["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name  # bitwise
        changed += not torch.equal(at_kill["state_dict"][name], value)
    assert changed > 0  # steps 10-12 did move the parameters: the comparison is not of step 9 with itself
    pairs = list(zip(_tensors(expected["optimizer_states"][0]), _tensors(resumed["optimizer_states"][0]), strict=True))
    assert pairs and all(torch.equal(a, b) for a, b in pairs)
    assert resumed["label_ledger"] == expected["label_ledger"]
    assert resumed["label_ledger"]["query_sets"] == 12 * 4  # each step's labels counted once, none twice

    # The resumed run is the same W&B run: a second offline folder of that id, whose history goes on from step 9.
    folders = find_offline_runs(run)
    assert len(folders) == 2 and all(f.name.endswith(f"-{run_id}") for f in folders)
    steps = [row["trainer/global_step"] for row in read_history(folders[-1]) if "trainer/global_step" in row]
    assert steps and min(steps) >= 9 and max(steps) >= 11
    summary = json.loads((checkpoint.parent.parent / "summary.json").read_text())  # one run folder, both parts
    assert summary["steps"] == 12


def _die_mid_write(path: Path, checkpoint: dict, atomic: bool) -> int:
    """Save ``checkpoint`` to ``path`` in a forked child that is SIGKILLed halfway through writing; its status."""
    data = io.BytesIO()
    torch.save(checkpoint, data)
    half = data.getvalue()[: len(data.getvalue()) // 2]

    def save_half_then_die(obj, f, *args, **kwargs):
        with open(f, "wb") if isinstance(f, (str, Path)) else f as out:
            out.write(half)
            out.flush()
            os.fsync(out.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            torch.save = save_half_then_die
            if atomic:
                AtomicCheckpointIO().save_checkpoint(checkpoint, path)
            else:
                torch.save(checkpoint, path)  # what writing straight to the target does
        finally:
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    first, second = {"step": 1, "weights": torch.arange(100000.0)}, {"step": 2, "weights": torch.zeros(100000)}
    AtomicCheckpointIO().save_checkpoint(first, path)
    status = _die_mid_write(path, second, atomic=True)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    checkpoint = _load(path)
    assert checkpoint["step"] == 1 and torch.equal(checkpoint["weights"], first["weights"])
    (leftover,) = tmp_path.glob(".last.ckpt.tmp-*")  # the half-written temporary, beside it
    assert 0 < leftover.stat().st_size < path.stat().st_size
    AtomicCheckpointIO().save_checkpoint({"step": 3}, path)  # the next save clears what the dead process left
    assert _load(path)["step"] == 3 and not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]

    # Control: the same kill while writing straight to the file leaves a checkpoint that cannot be read.
    control = tmp_path / "control" / "last.ckpt"
    control.parent.mkdir()
    torch.save(first, control)
    status = _die_mid_write(control, second, atomic=False)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError or an unpickling error
        _load(control)


def test_a_full_disk_during_a_save_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert _load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_last_is_the_newest_last_ckpt_of_the_config_and_names_its_run(tmp_path):
    def write(relative: str, mtime: float, **content) -> Path:
        path = tmp_path / relative
        AtomicCheckpointIO().save_checkpoint({"global_step": 5, **content}, path)
        os.utime(path, (mtime, mtime))
        return path

    now = time.time()
    write("quickstart/units-lightning/old/checkpoints/last.ckpt", now - 100, **{RUN_KEY: {"logger": "WandbLogger"}})
    newest = write("quickstart/units-lightning/abc123/checkpoints/last-v1.ckpt", now - 10)  # no record: the folder
    write("quickstart/units-lightning/abc123/checkpoints/step9-acc0.9000.ckpt", now)  # not a "last" checkpoint
    write("quickstart/units-lightning/abc123/checkpoints/.last.ckpt.tmp-1-x", now)  # a temporary
    write("other_config/units-lightning/new/checkpoints/last.ckpt", now)  # another config's run
    folders = [str(tmp_path / "quickstart" / "*" / "*" / "checkpoints")]
    assert find_last_checkpoint(folders) == newest
    assert stored_run(newest) == {"logger": None, "version": "abc123", "global_step": 5}
    recorded = stored_run(tmp_path / "quickstart/units-lightning/old/checkpoints/last.ckpt")  # its record wins
    assert recorded == {"logger": "WandbLogger", "version": None, "global_step": 5}
    assert find_last_checkpoint([str(tmp_path / "none" / "*" / "*" / "checkpoints")]) is None


@pytest.mark.parametrize("config", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_writes_last_ckpt_at_every_validation(config):
    callbacks = yaml.safe_load(config.read_text())["trainer"]["callbacks"]
    checkpoints = [c["init_args"] for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]
    # Lightning 2.6 writes a save_last copy only when a top-k file is saved (when val/acc improves): an
    # unmonitored ModelCheckpoint named "last" writes last.ckpt at every validation instead.
    assert [c for c in checkpoints if c.get("filename") == "last" and c.get("monitor") is None]
    assert not [c for c in checkpoints if c.get("save_last")]
    assert not [c for c in checkpoints if c.get("dirpath")]  # one folder per W&B run: resume continues in it


def _config(tmp_path: Path, ckpt_path: str, logger: str = "WandbLogger") -> "Namespace":  # noqa: F821
    from jsonargparse import Namespace

    init_args = Namespace(save_dir=str(tmp_path / "runs"), id=None, version=None)
    if logger == "WandbLogger":
        init_args.resume = None  # as the CLI parses WandbLogger: every wandb.init argument, None when not given
    logger_config = Namespace(class_path=f"lightning.pytorch.loggers.{logger}", init_args=init_args)
    trainer = Namespace(logger=logger_config, callbacks=[], default_root_dir=str(tmp_path / "runs"))
    return Namespace(ckpt_path=ckpt_path, trainer=trainer)


def test_fit_from_a_checkpoint_continues_its_logger_run_and_other_commands_do_not(tmp_path, capsys):
    from units_lightning.cli.checkpoints import resolve_ckpt_path as _resolve_ckpt_path

    checkpoint = tmp_path / "runs" / "units-lightning" / "abc123" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(
        {"global_step": 7, RUN_KEY: {"logger": "WandbLogger", "version": "abc123"}}, checkpoint
    )
    for given in ("last", str(checkpoint)):  # `last`, or the file named: the same W&B run goes on
        config = _config(tmp_path, given)
        _resolve_ckpt_path(config, "fit")
        assert config.ckpt_path == str(checkpoint)
        assert config.trainer.logger.init_args.id == "abc123" and config.trainer.logger.init_args.resume == "allow"
        assert "(step 7, continuing W&B run abc123)" in capsys.readouterr().out

    config = _config(tmp_path, "last")
    _resolve_ckpt_path(config, "test")  # a test of the checkpoint goes on in its W&B run too
    assert config.ckpt_path == str(checkpoint) and config.trainer.logger.init_args.id == "abc123"
    config = _config(tmp_path, "last")
    _resolve_ckpt_path(config, "predict")  # predict logs nothing
    assert config.trainer.logger.init_args.id is None
    config = _config(tmp_path, "last", logger="CSVLogger")  # a W&B run id is no CSV version
    _resolve_ckpt_path(config, "fit")
    assert config.trainer.logger.init_args.version is None

    (tmp_path / "elsewhere").mkdir()
    config = _config(tmp_path / "elsewhere", "last")
    _resolve_ckpt_path(config, "fit")
    assert config.ckpt_path is None and config.trainer.logger.init_args.id is None
    assert "no last.ckpt in" in capsys.readouterr().out
    for given, command in (("last", "test"), ("best", "fit")):  # commands that need a checkpoint say so
        with pytest.raises(ValueError, match=f"--ckpt_path {given}: no checkpoint in .*elsewhere.*Train one with"):
            _resolve_ckpt_path(_config(tmp_path / "elsewhere", given), command)

    checkpoint.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="last.ckpt is not a checkpoint at all"):
        _resolve_ckpt_path(_config(tmp_path, "last"), "fit")


def test_best_is_the_best_checkpoint_its_run_recorded(tmp_path):
    from units_lightning.cli.checkpoints import resolve_ckpt_path as _resolve_ckpt_path

    folder = tmp_path / "runs" / "units-lightning" / "abc123" / "checkpoints"
    for name in ("step5-acc0.9000.ckpt", "step3-acc0.8000.ckpt"):
        AtomicCheckpointIO().save_checkpoint({"global_step": int(name[4])}, folder / name)
    state = {
        "monitor": "val/acc",
        # paths as written by the run, elsewhere (a run folder moved or copied resolves by file name)
        "best_model_path": "/moved/checkpoints/step5-acc0.9000.ckpt",
        "best_model_score": torch.tensor(0.9),
        "best_k_models": {
            "/moved/checkpoints/step5-acc0.9000.ckpt": torch.tensor(0.9),
            "/moved/checkpoints/step3-acc0.8000.ckpt": torch.tensor(0.8),
        },
    }
    callbacks = {"ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', 'every_n_train_steps': 0}": state}
    AtomicCheckpointIO().save_checkpoint({"global_step": 6, "callbacks": callbacks}, folder / "last.ckpt")
    assert best_checkpoint(folder / "last.ckpt") == folder / "step5-acc0.9000.ckpt"
    config = _config(tmp_path, "best")
    _resolve_ckpt_path(config, "test")
    assert config.ckpt_path == str(folder / "step5-acc0.9000.ckpt")
    (folder / "step5-acc0.9000.ckpt").unlink()  # the best of those left
    assert best_checkpoint(folder / "last.ckpt") == folder / "step3-acc0.8000.ckpt"
    minimum = {key.replace("'max'", "'min'"): value for key, value in callbacks.items()}
    AtomicCheckpointIO().save_checkpoint({"global_step": 6, "callbacks": minimum}, folder / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint({"global_step": 5}, folder / "step5-acc0.9000.ckpt")
    assert best_checkpoint(folder / "last.ckpt") == folder / "step3-acc0.8000.ckpt"  # mode min: the lower score


def test_sigterm_exits_with_status_143_and_says_how_to_continue(monkeypatch, capsys):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    import units_lightning.cli.dispatch as cli

    def stopped_by_sigterm(args):
        raise SIGTERMException()  # what Lightning raises at the step boundary after a SIGTERM (a SystemExit of 0)

    monkeypatch.setattr(cli, "cli_main", stopped_by_sigterm)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(QUICKSTART)])
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert "--ckpt_path last" in capsys.readouterr().err

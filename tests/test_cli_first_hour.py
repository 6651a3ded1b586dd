"""A new user's first hour on real ``units-lightning`` processes: the commands ``fit`` suggests work as printed, a
finished run is never rewritten, a bad checkpoint is one paragraph that says what the file is, Ctrl-C saves and
says how to resume, a failed command leaves nothing new behind, and ``fit --help`` reads cleanly."""

import shlex
import subprocess
import sys
from pathlib import Path

from tiny_setup import QUICKSTART, TINY_QUICKSTART

FAST = [*TINY_QUICKSTART, "--trainer.limit_train_batches=3"]  # 6 steps
COMMAND = [str(Path(sys.executable).parent / "units-lightning")]


def units_lightning(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_next_command_fit_prints_runs_as_printed(tmp_path):
    # Options given with a space and with `=`, a data override the checkpoint does not restore (the image size)
    # and a root folder: the hinted `test` needs them all.
    options = [word for word in FAST if not word.startswith("--data.image_size")]
    # Without W&B: a `test` started while the fit's W&B process still flushes its run (seen on loaded machines) is
    # refused with "run ID ... is in use", which is W&B's, not the hint's; the logger option is replayed too.
    given = ["fit", "--config", str(QUICKSTART), *options, "--data.image_size", "16", "--trainer.logger=false"]
    given += ["--trainer.default_root_dir"]
    fitted = units_lightning(*given, "my runs", cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    (hint,) = [line for line in fitted.stdout.splitlines() if line.startswith("next: ")]
    words = shlex.split(hint.removeprefix("next: "))
    assert words[:2] == ["units-lightning", "test"] and words[-2:] == ["--ckpt_path", "best"]
    tested = units_lightning(*words[1:], "--data.test_tasks=2", cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr
    assert "--trainer.logger=false" in words and "--data.image_size" in words
    assert len(list((tmp_path / "my runs").rglob("results.json"))) == 1  # the test of the fit's best checkpoint


def fit_in_process(root: Path, *args: str) -> None:
    """``units-lightning fit`` through ``main`` (as the console script runs it), its W&B run finished after."""
    import wandb

    from units_lightning.cli import main

    try:
        main(["fit", "--config", str(QUICKSTART), *FAST, f"--trainer.default_root_dir={root}", *args])
    finally:
        wandb.finish()


def test_a_finished_run_is_never_rewritten_and_a_longer_length_continues_it(tmp_path, capsys):
    fit_in_process(tmp_path, "--trainer.max_epochs=3")  # 9 steps
    (run,) = (tmp_path / "units-lightning").iterdir()
    trained = (run / "config.yaml").read_text()
    files = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    # Lightning itself refuses a checkpoint two epochs past the end (max_epochs=1); the others train nothing.
    for shorter in ("--trainer.max_epochs=1", "--trainer.max_epochs=2", "--trainer.max_epochs=3"):
        fit_in_process(tmp_path, "--ckpt_path=last", shorter)
        out = capsys.readouterr().out
        assert "finished at step 9; nothing to train" in out
        assert (run / "config.yaml").read_text() == trained
        assert sorted(p.name for p in run.iterdir()) == files
    fit_in_process(tmp_path, "--ckpt_path=last", "--trainer.max_epochs=4")
    assert "steps 12 (resumed at step 9" in capsys.readouterr().out
    assert "max_epochs: 4" in (run / "config.yaml").read_text()
    assert (run / "config.1.yaml").read_text() == trained  # the config the first 9 steps ran with


def _refusal(tmp_path: Path, capsys, checkpoint: Path) -> str:
    """What ``test --ckpt_path <checkpoint>`` says: one paragraph on stderr, exit status 1."""
    import pytest

    from units_lightning.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "test",
                "--config",
                str(QUICKSTART),
                *FAST,
                f"--trainer.default_root_dir={tmp_path}",
                "--ckpt_path",
                str(checkpoint),
            ]
        )
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err
    assert "mmap" not in err and "_use_new_zipfile_serialization" not in err and "weights_only" not in err
    assert err.strip().count("\n\n") == 0 and str(checkpoint) in err
    return err


def test_a_plain_torch_save_is_named_as_not_a_lightning_checkpoint(tmp_path, capsys):
    import torch

    path = tmp_path / "weights.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    err = _refusal(tmp_path, capsys, path)
    assert "not a Lightning checkpoint" in err and "pytorch-lightning_version" in err and "state_dict" in err


def test_a_text_file_a_foreign_pickle_and_a_truncated_checkpoint_are_each_named(tmp_path, capsys):
    import pickle

    import torch

    text = tmp_path / "notes.ckpt"
    text.write_text("step 300, val acc 0.52\n")
    assert "not a checkpoint at all" in _refusal(tmp_path, capsys, text)
    foreign = tmp_path / "scores.ckpt"
    foreign.write_bytes(pickle.dumps({"scores": [1, 2, 3]}))
    assert "a Python pickle" in _refusal(tmp_path, capsys, foreign)
    whole = tmp_path / "whole.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "pytorch-lightning_version": "2.6.6"}, whole)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert "cut short" in _refusal(tmp_path, capsys, cut)


def test_ctrl_c_on_fit_saves_last_ckpt_and_says_how_to_resume(tmp_path):
    import signal
    import time

    import torch

    args = [
        *FAST,
        "--trainer.max_epochs=30",
        "--trainer.limit_train_batches=10",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    process = subprocess.Popen(
        [*COMMAND, "fit", "--config", str(QUICKSTART), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("units-lightning/*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first validation (step 10) wrote last.ckpt: training goes on
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "stopped by Ctrl-C (SIGINT); continue with the same command and --ckpt_path last" in err
    assert "Traceback" not in err
    (last,) = tmp_path.glob("units-lightning/*/checkpoints/last.ckpt")
    step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    assert 10 <= step < 300  # saved where it stopped (at the step Ctrl-C came, unless that one validated)


def test_fit_help_shows_the_progress_modes_and_best_among_the_checkpoint_keywords(capsys):
    import pytest

    from units_lightning.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help-full"])  # jsonargparse's full list (`--help` is the short page: tests/test_cli_help.py)
    out = capsys.readouterr().out
    assert "<lambda>" not in out and "function" not in out.split("--progress", 1)[1].split("\n  --", 1)[0]
    entry = out[out.rindex("--ckpt_path CKPT_PATH") :].split("\n  --", 1)[0]
    assert '"best"' in entry and '"last"' in entry


def _listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def _failed_test(root: Path, capsys, *args: str) -> None:
    """``test`` of the run's best checkpoint with Omniglot under a folder that does not exist: it fails in the
    data module's setup, after its W&B part (continuing the checkpoint's run) was opened."""
    import pytest
    import wandb

    from units_lightning.cli import main

    bad_data = ["--data=units_lightning.data.OmniglotDataModule", f"--data.root={root / 'nonexistent'}"]
    with pytest.raises(SystemExit) as stopped:
        try:
            main(["test", "--config", str(QUICKSTART), *FAST, *args, *bad_data])
        finally:
            wandb.finish()
    assert stopped.value.code == 1
    assert "Omniglot not found" in capsys.readouterr().err


def test_a_failed_test_leaves_the_run_folder_and_the_wandb_folder_as_they_were(tmp_path, capsys):
    fit_in_process(tmp_path)
    (run,) = (tmp_path / "units-lightning").iterdir()
    (best,) = (p for p in (run / "checkpoints").iterdir() if p.name != "last.ckpt")
    links = {link.name: link.readlink() for link in (tmp_path / "wandb").iterdir() if link.is_symlink()}
    before = _listing(tmp_path)
    _failed_test(tmp_path, capsys, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path=best")
    assert _listing(tmp_path) == before  # no W&B part under the run id, no config_test.yaml
    assert {link.name: link.readlink() for link in (tmp_path / "wandb").iterdir() if link.is_symlink()} == links
    # Another root: the W&B folder and the run folder the failed command opened there are removed with it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _failed_test(tmp_path, capsys, f"--trainer.default_root_dir={elsewhere}", f"--ckpt_path={best}")
    assert list(elsewhere.iterdir()) == []
    assert _listing(tmp_path) == sorted([*before, "elsewhere"])

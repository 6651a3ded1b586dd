"""A new user's first hour on real ``units-lightning`` processes: the commands ``fit`` suggests work as printed, a
finished run is never rewritten, a bad checkpoint is one paragraph that says what the file is, Ctrl-C saves and
says how to resume, a failed command leaves nothing new behind, and ``fit --help`` reads cleanly."""

import shlex
import subprocess
import sys
from pathlib import Path

from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART

FAST = [*TINY_QUICKSTART, "--trainer.limit_train_batches=3"]  # 6 steps
COMMAND = [str(Path(sys.executable).parent / "units-lightning")]


def units_lightning(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_next_command_fit_prints_runs_as_printed(tmp_path):
    # Options given with a space and with `=`, a data override the checkpoint does not restore (the image size)
    # and a root folder: the hinted `test` needs them all.
    options = [word for word in FAST if not word.startswith("--data.image_size")]
    given = ["fit", "--config", str(QUICKSTART), *options, "--data.image_size", "16", "--trainer.default_root_dir"]
    fitted = units_lightning(*given, "my runs", cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    (hint,) = [line for line in fitted.stdout.splitlines() if line.startswith("next: ")]
    words = shlex.split(hint.removeprefix("next: "))
    assert words[:2] == ["units-lightning", "test"] and words[-2:] == ["--ckpt_path", "best"]
    tested = units_lightning(*words[1:], "--data.test_tasks=2", cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr
    (run,) = (tmp_path / "my runs" / "units-lightning").iterdir()
    assert (run / "results.json").is_file()

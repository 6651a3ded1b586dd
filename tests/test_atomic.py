"""Files written whole or not at all: content as given, the old file kept when a write fails, leftovers of dead
writers removed and a live writer's kept. (A kill in the middle of a write: tests/test_resume.py.)"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from units_lightning.atomic import remove_stale_temporaries, write_atomically, write_text_atomically


def test_text_is_written_as_given_into_a_new_folder(tmp_path):
    path = tmp_path / "new" / "labels.csv"
    write_text_atomically(path, "query,label\r\nq1,chat\u00e9\n")
    assert path.read_bytes() == "query,label\r\nq1,chat\u00e9\n".encode()  # UTF-8, line endings untouched
    write_text_atomically(path, "replaced")
    assert path.read_text() == "replaced" and os.listdir(path.parent) == ["labels.csv"]


def test_a_new_file_gets_the_mode_any_new_file_gets(tmp_path):
    umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "file", lambda file: file.write(b"x"))
    finally:
        os.umask(umask)
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o640


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_text_atomically(path, "old")

    def disk_full(file):
        file.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, disk_full)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["state.json"]


def test_only_the_temporaries_of_dead_writers_of_that_file_are_removed(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)  # a process that has exited (its pid is not reused this quickly)
    dead = tmp_path / f".last.ckpt.tmp-{dead_pid}-ab12"
    live = tmp_path / f".last.ckpt.tmp-{os.getpid()}-cd34"  # this process: a write in progress
    other_file = tmp_path / f".best.ckpt.tmp-{dead_pid}-ef56"
    not_ours = tmp_path / ".last.ckpt.tmp-notapid"
    for path in (dead, live, other_file, not_ours):
        path.write_bytes(b"half")
    remove_stale_temporaries(tmp_path / "last.ckpt")
    assert not dead.exists() and live.exists() and other_file.exists() and not_ours.exists()

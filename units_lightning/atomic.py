"""Files written whole or not at all: a temporary file beside the target, flushed to disk, renamed over it.

A reader, a kill, a power loss or a full disk during a write sees, or leaves, the old file or the new one, never
a part. The temporary file sits in the target's own folder, so the rename never crosses file systems (a
``tempfile.mkstemp()`` file in a tmpfs ``/tmp`` would be copied onto the target, not renamed); it is named
``.<name>.tmp-<pid>-<random>`` so that a later write can tell the leftovers of a killed process from those of a
live one (``remove_stale_temporaries``). Checkpoints (``resume.AtomicCheckpointIO``), the annotation files and
the decoded-image cache are all written through ``write_atomically``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["remove_stale_temporaries", "write_atomically", "write_text_atomically"]

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[^.]+$")


def _temporary_beside(target: Path) -> Path:
    return target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system (or OS) lets a folder be opened and synced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomically(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file through ``write`` so that it appears whole or not at all.

    ``write`` gets the temporary file opened for binary writing; once it returns, the file is flushed and synced
    to disk, renamed over ``path`` and the folder is synced. When anything fails the temporary file is removed
    and the error raised: ``path`` keeps its previous content.

    Args:
        path: the file to write; its folder is created if needed. The new file's mode is 0o666 less the umask,
            as for any new file.
        write: writes the whole content into the file it is given (``lambda file: torch.save(obj, file)``).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_beside(target)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8, line endings as given) to ``path`` whole or not at all (see ``write_atomically``)."""
    write_atomically(path, lambda file: file.write(text.encode("utf-8")))


def remove_stale_temporaries(path: str | Path) -> None:
    """Remove the temporary files of writes to ``path`` that a process killed mid-write left beside it.

    Only files named as ``write_atomically`` names them, by a process that no longer runs, are removed: a write
    in progress in another live process keeps its file.
    """
    target = Path(path)
    for candidate in target.parent.glob(f".{target.name}.tmp-*"):
        match = _TEMPORARY.match(candidate.name)
        if match and match["name"] == target.name and not _pid_alive(int(match["pid"])):
            with contextlib.suppress(OSError):
                candidate.unlink()

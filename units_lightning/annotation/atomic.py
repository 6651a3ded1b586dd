"""Files written whole or not at all: a temporary file beside the target, flushed to disk, then renamed over it."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["write_text_atomically"]


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a crash) sees the old file or the new one, never a part.

    The temporary file sits in the target's folder, so the rename never crosses file systems (the same reasoning
    as ``units_lightning.resume.AtomicCheckpointIO``); it is removed when the write fails.

    Args:
        path: the file to write; its folder is created if needed.
        text: the whole new content (UTF-8).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened and synced
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

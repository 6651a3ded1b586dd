"""What a file given as ``--ckpt_path`` is, when it is not a checkpoint the command can use.

torch's own errors for such a file name torch's internals (``mmap``, ``_use_new_zipfile_serialization``, a
``KeyError: 'pytorch-lightning_version'`` deep in Lightning's loader) rather than the file. ``checkpoint_problem``
looks at the file itself and says what it is, and what to do, in a sentence.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

__all__ = ["checkpoint_problem"]

_ZIP = b"PK\x03\x04"  # torch.save's format since torch 1.6 is a zip archive
_PICKLE = b"\x80"  # a pickle of protocol 2 or later (torch's legacy format starts with one too)
_LIGHTNING_KEY = "pytorch-lightning_version"  # in every checkpoint Lightning's Trainer writes
_WHAT_TO_DO = "pass a checkpoint that `units-lightning fit` wrote (`<run>/checkpoints/*.ckpt`), or --ckpt_path last"


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be used as a Lightning checkpoint, in words a person acts on, or None when it can.

    The kinds told apart: not a checkpoint at all (text or other bytes), a Python pickle that torch did not
    write, a torch file cut short (a copy or a write that stopped halfway), and a ``torch.save`` file that is not a
    Lightning checkpoint (its keys are named, and how to load its weights instead).
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        head = file.read(4)
    if head == _ZIP:
        try:
            zipfile.ZipFile(path).close()  # reads the index at the end of the file, which a cut removes
        except (zipfile.BadZipFile, OSError, EOFError):
            return (
                f"is a torch file cut short ({size:,} bytes, its index missing): a copy or a save that stopped "
                f"halfway. Copy it again from where it was written, or {_WHAT_TO_DO} (with `last`, move this file "
                "away and the newest one before it is used)"
            )
    elif head.startswith(_PICKLE):
        try:
            with path.open("rb") as file:
                found = type(pickle.load(file)).__name__  # noqa: S301 - only after torch's safe loader refused it
        except Exception:  # a legacy torch file or a pickle that needs classes this environment lacks
            found = None
        if found is not None:
            return (
                f"is a Python pickle (of a {found}), not a checkpoint: neither torch.save nor Lightning wrote it. "
                f"{_WHAT_TO_DO[0].upper()}{_WHAT_TO_DO[1:]}"
            )
        return None  # torch's legacy format: torch.load says what it makes of it
    else:
        kind = "text" if _is_text(path) else "bytes torch cannot read"
        return f"is not a checkpoint at all ({size:,} bytes of {kind}). {_WHAT_TO_DO[0].upper()}{_WHAT_TO_DO[1:]}"
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None  # a torch file torch cannot read safely: its own message names the class
    if isinstance(content, dict) and (_LIGHTNING_KEY in content or "global_step" in content):
        return None  # Lightning's (a bare record of a step, as tests write, is left to the loader)
    keys = ", ".join(map(repr, list(content)[:6])) if isinstance(content, dict) else f"a {type(content).__name__}"
    return (
        f"is not a Lightning checkpoint: a torch.save file holding {keys}, without {_LIGHTNING_KEY!r} (nor the "
        "optimizer, loop and ledger state a run resumes from). To use its weights, load them into a model "
        "from Python (`model.load_state_dict(torch.load(path)['state_dict'])` for a saved state_dict); "
        f"otherwise {_WHAT_TO_DO}"
    )


def _is_text(path: Path) -> bool:
    with path.open("rb") as file:
        sample = file.read(4096)
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in sample

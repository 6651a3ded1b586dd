"""Resume: checkpoints written atomically, a config's newest ``last.ckpt``, and the run it belongs to.

- ``AtomicCheckpointIO`` writes a checkpoint to a temporary file in the checkpoint's own folder, flushes it to
  disk (``fsync``) and renames it over the target (``os.replace``), then syncs the folder. A kill, a power loss
  or a full disk during a save leaves the previous file whole. Lightning's own ``TorchCheckpointIO`` buffers the
  whole checkpoint in memory and commits an fsspec transaction, whose temporary file is made by
  ``tempfile.mkstemp()`` in the system temporary folder: when that is another file system than the checkpoint's
  (a tmpfs ``/tmp``, a mounted ``runs/``), the commit is a copy onto the target, not a rename, and nothing is
  synced.
- ``find_last_checkpoint`` returns the newest ``last.ckpt`` (or ``last-v1.ckpt``, ...) among the checkpoint
  folders a config's runs write to; ``find_best_checkpoint`` the best by the monitored metric (``val/acc``) of
  that same run, as its ``ModelCheckpoint`` recorded it.
- ``RUN_KEY``: the entry of a checkpoint that names the logger and its run version (the W&B run id) that wrote
  it (``units_lightning.callbacks.run_version.RecordRunVersion`` writes it); ``stored_run`` reads it back, so a
  resumed run continues the same W&B run and log folder.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

from units_lightning.atomic import remove_stale_temporaries, write_atomically

__all__ = [
    "RUN_KEY",
    "AtomicCheckpointIO",
    "best_checkpoint",
    "find_best_checkpoint",
    "find_last_checkpoint",
    "last_checkpoints",
    "stored_run",
]

RUN_KEY = "units_lightning_run"
# ModelCheckpoint's "last" file, with its version counter when one already existed: last.ckpt, last-v1.ckpt
_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are write-to-temporary, ``fsync``, rename.

    The temporary file is ``.<name>.tmp-<pid>-<random>`` beside the target, so the rename never crosses file
    systems; it is removed when the save fails (a full disk raises ``OSError`` and leaves the previous
    checkpoint and no partial file), and a later save to the same target removes those a killed process left.
    Remote paths (``s3://`` ...) go to ``TorchCheckpointIO``, whose object stores write whole objects.

    The ``units-lightning`` command installs it in place of the default ``TorchCheckpointIO``; from Python::

        trainer = pl.Trainer(plugins=[AtomicCheckpointIO()])
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        remove_stale_temporaries(path)
        write_atomically(path, lambda file: torch.save(checkpoint, file))


def last_checkpoints(folders: Iterable[str | Path]) -> list[Path]:
    """Every ``last.ckpt`` / ``last-v<N>.ckpt`` directly inside ``folders`` (each a path or a glob pattern)."""
    found: set[Path] = set()
    for pattern in folders:
        for folder in glob.glob(str(pattern)):
            found.update(p for p in Path(folder).glob("last*.ckpt") if _LAST.match(p.name) and p.is_file())
    return sorted(found)


def find_last_checkpoint(folders: Iterable[str | Path]) -> Path | None:
    """The most recently written ``last*.ckpt`` in ``folders`` (see ``last_checkpoints``), or None."""
    candidates = last_checkpoints(folders)
    return max(candidates, key=lambda p: (p.stat().st_mtime_ns, str(p))) if candidates else None


def _monitored_states(checkpoint: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(mode, state)`` of each ``ModelCheckpoint`` with a monitor in a checkpoint's callback states."""
    found = []
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not (isinstance(key, str) and key.startswith("ModelCheckpoint") and isinstance(state, dict)):
            continue
        if state.get("monitor"):
            mode = re.search(r"'mode': '(min|max)'", key)
            found.append((mode.group(1) if mode else "max", state))
    return found


def best_checkpoint(last: str | Path) -> Path | None:
    """The best checkpoint of the run that wrote ``last`` (a ``last.ckpt``), or None where it recorded none.

    Read from the state of the run's monitored ``ModelCheckpoint`` stored in ``last``: the best of its top-k files
    (``best_k_models``) that still lie in ``last``'s folder. Only file names are used, so a run folder that was
    moved or copied still resolves.
    """
    last = Path(last)
    checkpoint = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    candidates: list[tuple[float, Path]] = []
    for mode, state in _monitored_states(checkpoint):
        scored = dict(state.get("best_k_models") or {})
        if state.get("best_model_path") and state.get("best_model_score") is not None:
            scored.setdefault(state["best_model_path"], state["best_model_score"])
        for name, score in scored.items():
            path = last.parent / Path(str(name)).name
            if path.is_file() and score is not None:
                value = float(score)
                candidates.append((value if mode == "max" else -value, path))
    return max(candidates, key=lambda c: (c[0], str(c[1])))[1] if candidates else None


def find_best_checkpoint(folders: Iterable[str | Path]) -> Path | None:
    """The best checkpoint (see ``best_checkpoint``) of the run whose ``last.ckpt`` is newest in ``folders``."""
    last = find_last_checkpoint(folders)
    return None if last is None else best_checkpoint(last)


def stored_run(path: str | Path) -> dict[str, Any]:
    """What a checkpoint records of its run: ``{"logger": class name, "version": run version, "global_step": N}``.

    Both are None for a run without a logger. A checkpoint written without ``RecordRunVersion`` (before it
    existed) in Lightning's default folder ``<save_dir>/<name>/<version>/checkpoints/`` gives ``version`` from the
    path (the W&B run id, or N of ``version_N``), and ``logger`` None.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    record = {"logger": None, "version": None, **(checkpoint.get(RUN_KEY) or {})}
    if RUN_KEY not in checkpoint:
        path = Path(path)
        version: Any = path.parent.parent.name if path.parent.name == "checkpoints" else None
        if version and re.fullmatch(r"version_\d+", version):
            version = int(version.removeprefix("version_"))
        record["version"] = version or None
    record["global_step"] = int(checkpoint.get("global_step", 0))
    return record

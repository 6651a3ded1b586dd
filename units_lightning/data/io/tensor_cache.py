"""Decoded datasets on disk: one ``torch.save`` file per dataset, named and checked by a content key.

A loader describes what it decodes (format version, image shape, the sources' fingerprints) as a JSON-able
dict; ``cache_key`` hashes it. The file holds the key beside tensors and name lists, and is loaded with
``weights_only=True``, so a cache file can never run code. A stale, truncated or foreign file is ignored
(with a warning where it is unreadable) and rewritten; a cache folder that cannot be written costs a warning
and a decode per load, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch


def cache_key(description: dict[str, Any]) -> str:
    """Hex sha256 of a JSON description of the cached content (keys sorted)."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def read_cache(path: Path, key: str, what: str) -> dict[str, Any] | None:
    """The payload saved at ``path`` under ``key``, or None when absent, stale or unreadable.

    Args:
        path: the cache file.
        key: the expected ``cache_key``.
        what: the dataset's name, for the warning about an unreadable file.
    """
    if not path.is_file():
        return None
    try:
        cached = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: decode again and overwrite it
        warnings.warn(f"ignoring unreadable {what} cache {path} ({error}); decoding again", stacklevel=3)
        return None
    if not isinstance(cached, dict) or cached.get("key") != key:
        return None
    return cached


def write_cache(path: Path, key: str, payload: dict[str, Any], what: str) -> None:
    """Save ``payload`` (tensors, lists of strings) with ``key`` at ``path`` atomically.

    The file is written to a temporary name in the same folder and renamed, so a reader never sees half
    a file. Failure to write is a warning, not an error.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(handle)
        try:
            torch.save({"key": key, **payload}, temporary)
            os.chmod(temporary, 0o644)  # mkstemp creates 0600; the cache may be shared
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)
    except OSError as error:
        warnings.warn(
            f"could not write the {what} cache {path} ({error}); every load will decode the images again. "
            "Pass a writable cache_dir or set UNITS_LIGHTNING_CACHE.",
            stacklevel=3,
        )

"""Read an offline W&B run back from disk (wandb >= 0.31 ships no reader for ``run-<id>.wandb`` files).

The file is a 7-byte header (``:W&B`` and 3 bytes) followed by LevelDB-log records in 32 KiB blocks:
each chunk has a 4-byte CRC, a 2-byte little-endian length and a 1-byte type (1 full, 2 first,
3 middle, 4 last). Each assembled record is a ``wandb_internal_pb2.Record``; ``history`` records hold
the logged rows.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["find_offline_runs", "read_history", "read_records"]

_HEADER = 7
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a W&B run file (missing ':W&B' header)")
    position, pending = _HEADER, b""
    while position + _CHUNK_HEADER <= len(data):
        room = _BLOCK - position % _BLOCK
        if room < _CHUNK_HEADER:  # block trailer padding
            position += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + _CHUNK_HEADER])
        position += _CHUNK_HEADER
        chunk = data[position : position + length]
        position += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""
        elif kind == 0:  # zero-filled tail: no more records
            return
        else:
            raise ValueError(f"corrupt W&B run file: chunk type {kind} at byte {position - length - _CHUNK_HEADER}")


def read_records(path: str | Path) -> Iterator[Any]:
    """Every ``wandb_internal_pb2.Record`` of a ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    for payload in _payloads(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The logged history rows of an offline run, as dicts of key -> decoded JSON value.

    Args:
        path: a ``run-<id>.wandb`` file or the offline run folder holding one.

    Returns:
        One dict per ``wandb.log`` call, in order.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("run-*.wandb"))
        if not files:
            raise FileNotFoundError(f"no run-*.wandb file in {path}")
        path = files[0]
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json) if item.value_json else None
        rows.append(row)
    return rows


def find_offline_runs(save_dir: str | Path) -> list[Path]:
    """Offline run folders under a logger's ``save_dir`` (``<save_dir>/wandb/offline-run-*``), oldest first."""
    return sorted(Path(save_dir).glob("wandb/offline-run-*"))

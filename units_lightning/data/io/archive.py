"""Safe zip extraction and the cache folder that downloaded or decoded data lives in.

Archives are untrusted input: a zip can name entries outside the folder it is unpacked into
(``../../.bashrc``, ``/etc/passwd``), carry symlinks, or declare gigabytes that inflate from kilobytes.
``check_zip_members`` refuses all of those before a single byte is written, and ``safe_extract``
unpacks only what passed, into a hidden temporary folder that is moved into place when complete.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MAX_TOTAL_BYTES = 4 * 2**30
# Deflate tops out near 1032:1; real data (images, CSV, text) stays far below 100:1 per entry.
DEFAULT_MAX_RATIO = 100.0
# Entries smaller than this cannot do harm whatever their ratio (a 10 KiB file of zeros is 500:1).
RATIO_CHECK_MIN_BYTES = 2**20
_COPY_CHUNK = 2**20
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


def default_cache_dir() -> Path:
    """The folder units-lightning keeps extracted archives and decoded datasets in.

    Returns:
        ``$UNITS_LIGHTNING_CACHE`` if set and non-empty, else ``~/.cache/units-lightning``. The folder
        is not created.
    """
    configured = os.environ.get("UNITS_LIGHTNING_CACHE", "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "units-lightning"


def member_path(zip_name: str, entry_name: str) -> str:
    """The normalised relative path an entry of a zip may be written to.

    Args:
        zip_name: the archive, for the error message.
        entry_name: ``ZipInfo.filename``.

    Returns:
        A relative POSIX path without ``.``/``..`` components ("" for the archive root).

    Raises:
        ValueError: the entry is absolute (``/x``, ``\\x``, ``C:x``) or its ``..`` components leave
            the extraction folder.
    """
    # Treat backslashes as separators too: a zip made on Windows may use them, and a Windows reader
    # would follow them.
    name = entry_name.replace("\\", "/")
    if name.startswith("/") or _WINDOWS_DRIVE.match(name):
        raise ValueError(
            f"unsafe zip {zip_name}: entry {entry_name!r} has an absolute path; refusing to extract. "
            "Only relative entry names are allowed; re-create the archive from its folder."
        )
    normalised = posixpath.normpath(name) if name else "."
    if normalised == ".." or normalised.startswith("../"):
        raise ValueError(
            f"unsafe zip {zip_name}: entry {entry_name!r} escapes the extraction folder via '..'; "
            "refusing to extract. The archive is malformed or malicious; obtain it from a trusted source."
        )
    return "" if normalised == "." else normalised


def is_symlink(info: zipfile.ZipInfo) -> bool:
    """Whether a zip entry is a symbolic link (Unix mode ``S_IFLNK`` in its external attributes)."""
    return stat.S_ISLNK(info.external_attr >> 16)


def check_zip_members(
    archive: zipfile.ZipFile,
    zip_name: str,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> list[tuple[zipfile.ZipInfo, str]]:
    """Validate every entry of an open zip before anything is read from it.

    Args:
        archive: the open archive.
        zip_name: how to name the archive in error messages.
        max_total_bytes: limit on the sum of the declared uncompressed sizes.
        max_ratio: limit on ``file_size / compress_size`` of any entry of at least
            ``RATIO_CHECK_MIN_BYTES`` uncompressed bytes (a "zip bomb").

    Returns:
        ``(info, relative_path)`` for every entry, in archive order; directories keep their entry
        (``info.is_dir()``); entries that normalise to the root get ``""``.

    Raises:
        ValueError: an entry is absolute, escapes via ``..``, is a symlink, inflates by more than
            ``max_ratio``, or the archive declares more than ``max_total_bytes`` in total. The message
            names the archive and the entry.
    """
    members: list[tuple[zipfile.ZipInfo, str]] = []
    total = 0
    for info in archive.infolist():
        relative = member_path(zip_name, info.filename)
        if is_symlink(info):
            raise ValueError(
                f"unsafe zip {zip_name}: entry {info.filename!r} is a symbolic link; refusing to extract. "
                "Re-create the archive without links (zip without -y)."
            )
        if info.file_size >= RATIO_CHECK_MIN_BYTES and info.file_size > max_ratio * max(info.compress_size, 1):
            ratio = info.file_size / max(info.compress_size, 1)
            raise ValueError(
                f"unsafe zip {zip_name}: entry {info.filename!r} inflates {info.compress_size} bytes to "
                f"{info.file_size} ({ratio:.0f}:1, limit {max_ratio:g}:1), which looks like a zip bomb; "
                "refusing to extract. Pass a larger max_ratio if you trust this archive."
            )
        total += info.file_size
        if total > max_total_bytes:
            raise ValueError(
                f"unsafe zip {zip_name}: entries up to {info.filename!r} declare {total} uncompressed bytes, "
                f"over the limit of {max_total_bytes}; refusing to extract. Pass a larger max_total_bytes "
                "if you trust this archive and have the disk space."
            )
        members.append((info, relative))
    return members


def extraction_marker(zip_path: Path) -> str:
    """Name of the file that records a completed extraction of this exact archive (name, size, mtime)."""
    status = zip_path.stat()
    return f".extracted-{zip_path.name}-{status.st_size}-{status.st_mtime_ns}"


def open_zip(zip_path: str | Path) -> zipfile.ZipFile:
    """Open a zip archive, or raise ValueError naming it when it is not a valid one."""
    try:
        return zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as error:
        raise ValueError(f"{zip_path} is not a valid zip archive ({error}); delete it and download it again") from error


def safe_extract(
    zip_path: str | Path,
    dest: str | Path,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> Path:
    """Extract a zip into ``dest`` after checking every entry, once.

    The archive is unpacked into a hidden temporary folder inside ``dest``; when every entry is written,
    its files are moved into ``dest``, merging into folders that are already there (replacing files of the
    same name, e.g. what a previous, interrupted extraction left), and a marker
    ``.extracted-<zipname>-<size>-<mtime_ns>`` listing the files is written. A later call that finds the
    marker returns at once; a changed archive (other size or mtime) is extracted again after the files its
    previous version wrote are removed. Several zips may share one ``dest`` and even its folders (CIFAR-FS's
    ``train-a.zip`` and ``train-b.zip`` both fill ``train/``).

    Args:
        zip_path: the archive.
        dest: folder to extract into; created if missing.
        max_total_bytes: refuse archives declaring more uncompressed bytes than this in total.
        max_ratio: refuse entries (of at least 1 MiB) whose compression ratio exceeds this.

    Returns:
        ``dest`` as a ``Path``.

    Raises:
        FileNotFoundError: ``zip_path`` does not exist.
        ValueError: the file is not a zip, or an entry is unsafe (see ``check_zip_members``); nothing is
            written in that case. Also raised if an entry inflates beyond its declared size.
    """
    zip_path = Path(zip_path)
    dest = Path(dest)
    if not zip_path.is_file():
        raise FileNotFoundError(f"zip archive {zip_path} does not exist; check the path or download it again")
    marker = extraction_marker(zip_path)
    if (dest / marker).is_file():
        return dest
    with open_zip(zip_path) as archive:
        members = check_zip_members(archive, str(zip_path), max_total_bytes, max_ratio)
        dest.mkdir(parents=True, exist_ok=True)
        # Leftovers of an interrupted extraction of this archive (extract one archive into one ``dest``
        # from one process at a time; Lightning's ``prepare_data`` runs on one rank).
        for leftover in dest.glob(f".partial-{_glob_escape(zip_path.name)}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".partial-{zip_path.name}-", dir=dest))
        try:
            for info, relative in members:
                _write_member(archive, info, relative, staging, str(zip_path))
            for stale in dest.glob(f".extracted-{_glob_escape(zip_path.name)}-*"):
                _remove_listed_files(stale, dest)
                stale.unlink(missing_ok=True)
            _move_into_place(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    written = sorted(relative for info, relative in members if relative and not info.is_dir())
    (dest / marker).write_text("".join(f"{relative}\n" for relative in written))
    return dest


def _glob_escape(name: str) -> str:
    """``name`` with glob metacharacters bracketed, so it matches only itself in ``Path.glob``."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _write_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, relative: str, staging: Path, zip_name: str) -> None:
    if not relative:
        return
    target = staging / relative
    if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with archive.open(info) as source, open(target, "wb") as sink:
        while chunk := source.read(_COPY_CHUNK):
            written += len(chunk)
            # zipfile already stops at the declared size; this guards against a reader that does not.
            if written > info.file_size:
                raise ValueError(
                    f"unsafe zip {zip_name}: entry {info.filename!r} inflates beyond its declared size of "
                    f"{info.file_size} bytes; refusing to extract"
                )
            sink.write(chunk)


def _move_into_place(staging: Path, dest: Path) -> None:
    """Move the tree under ``staging`` into ``dest``, merging folders and replacing files of the same name."""
    for entry in sorted(staging.iterdir()):
        target = dest / entry.name
        if entry.is_dir() and target.is_dir() and not target.is_symlink():
            _move_into_place(entry, target)
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(entry, target)


def _remove_listed_files(marker: Path, dest: Path) -> None:
    """Delete the files a previous extraction listed in its marker (only plain files inside ``dest``)."""
    try:
        listed = marker.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for relative in listed:
        try:
            relative = member_path(str(marker), relative)
        except ValueError:
            continue
        path = dest / relative
        if relative and path.is_file() and not path.is_symlink():
            path.unlink()

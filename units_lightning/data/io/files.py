"""Image files in a folder or a zip: listing, reading with named errors, and a cheap content fingerprint.

Every dataset reader goes through these: a folder is walked in sorted order, a zip is read in place after
``check_zip_members`` has vetted every entry (absolute paths, ``..`` escapes, symlinks and zip bombs are
refused before a byte is read), hidden entries (``.DS_Store``, ``__MACOSX``) are skipped, and a file that
cannot be read names itself (``<zip>/<member>`` inside an archive).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from units_lightning.data.io.archive import check_zip_members

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class ImageFile:
    """One image: where it sits in its layout, where it lives, and how to read it.

    Attributes:
        parts: path components relative to the folder or archive root, e.g. ``("train", "apple", "0.png")``.
        location: readable location for messages (``<folder>/<path>`` or ``<zip>/<member>``).
        read: returns the file's bytes.
    """

    parts: tuple[str, ...]
    location: str
    read: Callable[[], bytes]


def is_visible(name: str) -> bool:
    """Whether a path component is a real entry (not hidden, not macOS archive metadata)."""
    return not name.startswith(".") and name != "__MACOSX"


def is_image_name(name: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> bool:
    """Whether a file name is a visible image by its extension (case-insensitive)."""
    return is_visible(name) and name.lower().endswith(tuple(extensions))


def list_folder_images(folder: Path, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> list[ImageFile]:
    """Image files anywhere under ``folder``, sorted by their relative path.

    Hidden files and folders are skipped, and so are files of other types.
    """
    extensions = tuple(extensions)
    files = []
    for directory, subdirectories, names in os.walk(folder):
        subdirectories[:] = sorted(d for d in subdirectories if is_visible(d))
        relative = Path(directory).relative_to(folder).parts
        for name in sorted(names):
            if is_image_name(name, extensions):
                path = Path(directory) / name
                files.append(ImageFile((*relative, name), str(path), path.read_bytes))
    return sorted(files, key=lambda f: f.parts)


def list_zip_images(
    archive: zipfile.ZipFile, zip_path: Path, extensions: Iterable[str] = IMAGE_EXTENSIONS
) -> list[ImageFile]:
    """Image entries of an open zip, vetted by ``check_zip_members``, sorted by their path.

    Raises:
        ValueError: an entry is unsafe (absolute, escaping via ``..``, a symlink, a zip bomb); nothing is
            read in that case.
    """
    extensions = tuple(extensions)
    files = []
    for info, relative in check_zip_members(archive, str(zip_path)):
        parts = tuple(relative.split("/"))
        if info.is_dir() or not all(is_visible(p) for p in parts) or not is_image_name(parts[-1], extensions):
            continue
        files.append(ImageFile(parts, f"{zip_path}/{info.filename}", _zip_reader(archive, info)))
    return sorted(files, key=lambda f: f.parts)


def _zip_reader(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], bytes]:
    return lambda: archive.read(info)


def read_image_bytes(file: ImageFile, fix: str = "re-download the dataset") -> bytes:
    """The bytes of ``file``.

    Args:
        file: the image.
        fix: what to tell the user to do, completing "... is corrupt (...). <Fix>, or delete ...".

    Raises:
        ValueError: the file or its archive entry cannot be read (a CRC error, a truncated archive, a file
            that vanished); the message names ``file.location``.
    """
    try:
        return file.read()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        raise ValueError(
            f"cannot read {file.location}: the file is corrupt ({error}). {fix[:1].upper()}{fix[1:]}, or delete "
            "the file (or its archive) and load again."
        ) from error


def fingerprint(source: Path, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> dict[str, object]:
    """What identifies a source's content cheaply: a zip's path, size and mtime, or those of a folder's images.

    Args:
        source: a zip file or a folder.
        extensions: which files of a folder count.
    """
    if source.is_file():
        status = source.stat()
        return {"zip": str(source.resolve()), "size": status.st_size, "mtime_ns": status.st_mtime_ns}
    files = []
    for file in list_folder_images(source, extensions):
        status = os.stat(file.location)
        files.append(["/".join(file.parts), status.st_size, status.st_mtime_ns])
    return {"folder": str(source.resolve()), "files": files}

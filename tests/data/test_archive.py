"""safe_extract refuses malicious archives before writing anything, and extracts a good one once."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from units_lightning.data.io.archive import (
    check_zip_members,
    default_cache_dir,
    extraction_marker,
    member_path,
    safe_extract,
)


def write_zip(path: Path, entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def write_symlink_zip(path: Path, link_name: str, target: str) -> Path:
    info = zipfile.ZipInfo(link_name)
    info.create_system = 3  # Unix, so external_attr carries the mode
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ok.txt", b"fine")
        archive.writestr(info, target)
    return path


def test_good_zip_extracts_with_folders(tmp_path):
    archive = write_zip(tmp_path / "good.zip", {"top/a.txt": b"alpha", "top/sub/b.txt": b"beta", "top/./c.txt": b"c"})
    dest = safe_extract(archive, tmp_path / "out")
    assert dest == tmp_path / "out"
    assert (dest / "top" / "a.txt").read_bytes() == b"alpha"
    assert (dest / "top" / "sub" / "b.txt").read_bytes() == b"beta"
    assert (dest / "top" / "c.txt").read_bytes() == b"c"
    assert (dest / extraction_marker(archive)).is_file()
    # No staging folder is left behind.
    assert sorted(p.name for p in dest.iterdir()) == sorted([extraction_marker(archive), "top"])


def test_second_call_is_a_no_op(tmp_path):
    archive = write_zip(tmp_path / "good.zip", {"top/a.txt": b"alpha"})
    dest = safe_extract(archive, tmp_path / "out")
    # A change to the extracted file survives a second call: nothing was extracted again.
    (dest / "top" / "a.txt").write_bytes(b"edited")
    safe_extract(archive, dest)
    assert (dest / "top" / "a.txt").read_bytes() == b"edited"


def test_changed_archive_is_extracted_again(tmp_path):
    archive = write_zip(tmp_path / "data.zip", {"top/a.txt": b"old"})
    dest = safe_extract(archive, tmp_path / "out")
    old_marker = extraction_marker(archive)
    write_zip(archive, {"top/a.txt": b"new content"})
    os.utime(archive, ns=(1_000_000_000_000, 1_000_000_000_000))
    safe_extract(archive, dest)
    assert (dest / "top" / "a.txt").read_bytes() == b"new content"
    markers = [p.name for p in dest.glob(".extracted-*")]
    assert markers == [extraction_marker(archive)] and old_marker not in markers


def test_interrupted_extraction_is_redone(tmp_path):
    archive = write_zip(tmp_path / "data.zip", {"top/a.txt": b"alpha", "top/b.txt": b"beta"})
    dest = tmp_path / "out"
    # What a crash mid-way leaves: a partial tree and a staging folder, but no marker.
    (dest / "top").mkdir(parents=True)
    (dest / "top" / "a.txt").write_bytes(b"al")
    (dest / ".partial-data.zip-crashed").mkdir()
    safe_extract(archive, dest)
    assert (dest / "top" / "a.txt").read_bytes() == b"alpha"
    assert (dest / "top" / "b.txt").read_bytes() == b"beta"
    assert not list(dest.glob(".partial-*"))


def test_two_archives_share_a_destination(tmp_path):
    first = write_zip(tmp_path / "images_background.zip", {"images_background/x.txt": b"1"})
    second = write_zip(tmp_path / "images_evaluation.zip", {"images_evaluation/y.txt": b"2"})
    dest = tmp_path / "out"
    safe_extract(first, dest)
    safe_extract(second, dest)
    assert (dest / "images_background" / "x.txt").read_bytes() == b"1"
    assert (dest / "images_evaluation" / "y.txt").read_bytes() == b"2"


@pytest.mark.parametrize(
    "entry",
    ["../evil.txt", "top/../../evil.txt", "..\\evil.txt", "/etc/evil.txt", "\\evil.txt", "C:/evil.txt", ".."],
    ids=[
        "dotdot",
        "nested-dotdot",
        "backslash-dotdot",
        "absolute",
        "backslash-absolute",
        "drive",
        "bare-dotdot",
    ],
)
def test_escaping_entries_are_refused(tmp_path, entry):
    archive = write_zip(tmp_path / "evil.zip", {"fine.txt": b"ok", entry: b"pwned"})
    dest = tmp_path / "deep" / "out"
    with pytest.raises(ValueError, match="unsafe zip") as error:
        safe_extract(archive, dest)
    message = str(error.value)
    assert repr(entry) in message and "evil.zip" in message
    # Refused before writing anything, including the harmless entry.
    assert not dest.exists()
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "deep" / "evil.txt").exists()


def test_dotdot_that_stays_inside_is_allowed(tmp_path):
    archive = write_zip(tmp_path / "fine.zip", {"top/sub/../a.txt": b"alpha"})
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "top" / "a.txt").read_bytes() == b"alpha"


def test_symlink_entry_is_refused(tmp_path):
    archive = write_symlink_zip(tmp_path / "link.zip", "top/passwd", "/etc/passwd")
    with pytest.raises(ValueError, match="symbolic link") as error:
        safe_extract(archive, tmp_path / "out")
    assert "'top/passwd'" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_declared_size_over_the_limit_is_refused(tmp_path):
    archive = write_zip(tmp_path / "big.zip", {"small.bin": b"x" * 100, "large.bin": b"y" * 5000})
    with pytest.raises(ValueError, match="over the limit of 1000") as error:
        safe_extract(archive, tmp_path / "out", max_total_bytes=1000)
    assert "'large.bin'" in str(error.value) and "big.zip" in str(error.value)
    assert not (tmp_path / "out").exists()
    # The same archive passes under the default limit.
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "large.bin").stat().st_size == 5000


def test_compression_bomb_is_refused(tmp_path):
    # 4 MiB of zeros deflate to about 4 KiB: a ratio near 1000:1.
    archive = write_zip(tmp_path / "bomb.zip", {"zeros.bin": bytes(4 * 2**20)})
    with pytest.raises(ValueError, match="zip bomb") as error:
        safe_extract(archive, tmp_path / "out")
    assert "'zeros.bin'" in str(error.value)
    assert not (tmp_path / "out").exists()
    # A caller who trusts the archive can raise the limit.
    safe_extract(archive, tmp_path / "out", max_ratio=5000)
    assert (tmp_path / "out" / "zeros.bin").stat().st_size == 4 * 2**20


def test_small_highly_compressible_files_are_fine(tmp_path):
    # Small files may compress extremely well (blank images, padding) and are harmless.
    archive = write_zip(tmp_path / "blank.zip", {"blank.bin": bytes(2**19)})
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "blank.bin").stat().st_size == 2**19


def test_missing_and_corrupt_archives(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        safe_extract(tmp_path / "missing.zip", tmp_path / "out")
    not_a_zip = tmp_path / "broken.zip"
    not_a_zip.write_bytes(b"this is not a zip file")
    with pytest.raises(ValueError, match="not a valid zip.*download it again"):
        safe_extract(not_a_zip, tmp_path / "out")


def test_check_zip_members_returns_normalised_paths(tmp_path):
    archive = write_zip(tmp_path / "a.zip", {"top/./x/../y.txt": b"1", "top/": b""})
    with zipfile.ZipFile(archive) as opened:
        members = check_zip_members(opened, "a.zip")
    assert [relative for _, relative in members] == ["top/y.txt", "top"]
    assert member_path("a.zip", "./") == ""


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("UNITS_LIGHTNING_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("UNITS_LIGHTNING_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "units-lightning"

"""The server's own files: never followed, never waited on, written whole, errors in words.

Reads of a link, a directory or a FIFO where a record belongs are refused at once (a FIFO
with no writer would block a plain ``open`` for ever); writes leave the old file or the new
one, never a part and never a temporary file; on a real full file system (a small tmpfs the
test mounts, as root) an append is cut back and the disk reserve makes room.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmind.diskio import (
    NotAFile,
    Reserve,
    append_line,
    disk_sentence,
    disk_trouble,
    read_file,
    with_room,
    write_file,
)

AS_ROOT = os.geteuid() == 0


def planted(tmp_path: Path) -> dict[str, Path]:
    """A symbolic link (to a real file), a directory and a FIFO, each where a record should be."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"secret": 1}')
    link, folder, fifo = tmp_path / "link.json", tmp_path / "dir.json", tmp_path / "fifo.json"
    link.symlink_to(target)
    folder.mkdir()
    os.mkfifo(fifo)
    return {"a symbolic link": link, "a directory": folder, "a FIFO": fifo}


def _refusal_within_a_minute(path: Path) -> BaseException | None:
    """What ``read_file(path)`` raised, read in a thread: a FIFO without a writer would block its
    open forever, so a 60 s bound (a hang bound only) fails the test instead of hanging it."""
    raised: list[BaseException | None] = [None]

    def read() -> None:
        try:
            read_file(path, 1000)
        except BaseException as exc:  # handed to the test to judge
            raised[0] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    if reader.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked open
        pytest.fail(f"reading {path.name} blocked (a FIFO without a writer)")
    return raised[0]


def test_reads_refuse_links_directories_and_fifos_at_once(tmp_path: Path) -> None:
    for kind, path in planted(tmp_path).items():
        caught = _refusal_within_a_minute(path)
        assert isinstance(caught, NotAFile), (kind, caught)
        assert kind in str(caught), (kind, caught)
    (tmp_path / "ok.json").write_bytes(b"0123456789")
    assert read_file(tmp_path / "ok.json", 4) == b"0123"


def test_writes_and_appends_refuse_what_is_not_a_file_and_touch_nothing(tmp_path: Path) -> None:
    for path in planted(tmp_path).values():
        with pytest.raises(OSError):
            write_file(path, b"new")
        with pytest.raises(OSError):
            append_line(path, b"line\n")
    assert (tmp_path / "elsewhere.json").read_text() == '{"secret": 1}'  # the link was not followed
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    write_file(path, b"old")
    write_file(path, b"new content")
    assert path.read_bytes() == b"new content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_disk_errors_are_named_and_others_are_not() -> None:
    assert disk_trouble(OSError(errno.ENOSPC, "No space left on device")) == "the disk is full"
    assert disk_trouble(OSError(errno.EROFS, "Read-only file system")) == "the disk is read-only"
    assert disk_trouble(OSError(errno.EIO, "I/O error")) == "the disk reported an I/O error"
    assert disk_trouble(OSError(errno.ENOENT, "No such file")) is None
    assert disk_trouble(ValueError("x")) is None
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13  # what sqlite3 sets on SQLITE_FULL
    assert disk_trouble(full) == "the disk is full"
    sentence = disk_sentence(OSError(errno.ENOSPC, "x"), "save the meta", kept="Nothing was lost.")
    assert sentence is not None and sentence.startswith(
        "the disk is full: could not save the meta. Nothing was lost."
    )
    assert disk_sentence(OSError(errno.ENOENT, "x"), "save") is None


# --- on a real full file system ----------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if not AS_ROOT:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path, name: str = "ballast") -> None:
    """Write until the file system is full (every last byte)."""
    fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_an_append_on_a_full_disk_is_cut_back_and_the_next_one_is_whole(small_disk: Path) -> None:
    history = small_disk / "history.jsonl"
    append_line(history, b'{"call": 1}\n')
    fill(small_disk)
    with pytest.raises(OSError) as caught:
        append_line(history, b'{"call": 2, "big": "' + b"x" * 100_000 + b'"}\n')
    assert caught.value.errno == errno.ENOSPC
    assert history.read_bytes() == b'{"call": 1}\n'  # no half line left behind
    os.unlink(small_disk / "ballast")
    append_line(history, b'{"call": 3}\n')
    assert history.read_bytes().splitlines() == [b'{"call": 1}', b'{"call": 3}']


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(small_disk: Path) -> None:
    meta = small_disk / "meta.json"
    write_file(meta, b'{"v": 1}')
    fill(small_disk)
    with pytest.raises(OSError):
        write_file(meta, b"x" * 100_000)
    assert meta.read_bytes() == b'{"v": 1}'
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "meta.json"]


def test_the_reserve_makes_room_on_a_full_disk_and_comes_back(small_disk: Path) -> None:
    reserve = Reserve(small_disk / ".km-reserve", 256 * 1024)
    assert reserve.take() and reserve.held
    fill(small_disk)
    meta = small_disk / "meta.json"
    with pytest.raises(OSError):
        write_file(meta, b"{}")
    with_room(reserve, lambda: write_file(meta, b'{"saved": true}'))  # gives the reserve up
    assert meta.read_bytes() == b'{"saved": true}' and not reserve.held
    assert not reserve.take()  # no room for it yet
    os.unlink(small_disk / "ballast")
    assert reserve.take() and reserve.held  # space is back: so is the reserve

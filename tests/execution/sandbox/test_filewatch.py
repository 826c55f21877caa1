"""The inotify tracker (execution/sandbox/filewatch.py) agrees with a full walk, change after change.

Each step changes a real directory the way code in a session does (new files, in-place
edits, deletions, new nested folders, removed folders, renamed files and folders, a folder
swapped for a link to somewhere else) and checks that the tracker's scan equals a fresh
``scan_tree`` walk and that ``changed_since`` names exactly what the step created or changed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import threading
from pathlib import Path

import pytest

from kernmind.execution.sandbox.filescan import changed_since, scan_tree
from kernmind.execution.sandbox.filewatch import Tracker
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.disk_store import rebind

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def _tree(root: Path) -> None:
    for d in range(5):
        (root / f"d{d}").mkdir()
        for f in range(20):
            (root / f"d{d}" / f"f{f}.txt").write_text(str(f))


def _step(ws: Workspace, before):  # type: ignore[no-untyped-def]
    after = ws.scan()
    truth = scan_tree(ws.root)
    assert after.files == truth.files
    assert after.others == truth.others
    assert after.bytes_used == truth.bytes_used
    return after, changed_since(after, before, 0)


def test_directories_links_and_special_files_count_in_blocks_and_names(tmp_path: Path) -> None:
    """What the quota saw as 0 bytes: directories, long symbolic links (a block each), FIFOs,
    sockets and empty files (no block, one inode each), in bursts, and removed again."""
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace(root)
    first = ws.scan()
    assert first.inodes == 1 and first.others == {"": os.lstat(root).st_blocks}  # the root itself
    for i in range(300):
        (root / f"dir{i}").mkdir()
        (root / f"link{i}").symlink_to("x" * 3000)  # too long to live in the inode: a block
    os.mkfifo(root / "fifo")
    for i in range(200):
        (root / "dir0" / f"empty{i}").touch()
    after, _ = _step(ws, first)
    assert after.inodes == 1 + 300 + 300 + 1 + 200
    assert after.bytes_used >= 600 * 4096  # a block per directory and per long link
    assert after.files.keys() == {f"dir0/empty{i}" for i in range(200)}
    for i in range(300):
        (root / f"link{i}").unlink()
        (root / f"dir{i}").rmdir() if i else shutil.rmtree(root / "dir0")
    gone, _ = _step(ws, after)
    assert gone.inodes == 2 and gone.bytes_used < after.bytes_used // 20  # (a directory never shrinks)


def test_tracker_matches_a_full_walk_after_every_kind_of_change(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root)
    ws = Workspace(root)
    first = ws.scan()
    assert ws.tracker is not None and len(first.files) == 100
    same, changed = _step(ws, first)
    assert changed == []

    (root / "d0" / "f1.txt").write_text("edited in place, same folder entries")
    (root / "new.csv").write_text("a,b\n")
    after, changed = _step(ws, same)
    assert changed == ["d0/f1.txt", "new.csv"]

    (root / "d1" / "f2.txt").unlink()
    shutil.rmtree(root / "d2")
    (root / "n1" / "n2").mkdir(parents=True)
    (root / "n1" / "n2" / "deep.bin").write_bytes(b"x" * 5000)
    after2, changed = _step(ws, after)
    assert changed == ["n1/n2/deep.bin"]
    assert "d1/f2.txt" not in after2.files and not any(p.startswith("d2/") for p in after2.files)

    os.rename(root / "d3" / "f0.txt", root / "d3" / "renamed.txt")
    os.rename(root / "d4", root / "d4-moved")  # a folder move: the tracker walks again
    after3, changed = _step(ws, after2)
    assert "d3/renamed.txt" in changed and "d4-moved/f0.txt" in changed
    assert not any(p.startswith("d4/") for p in after3.files)

    # Changes consumed by another scan in between (a list_files) still count for the next call.
    (root / "between.txt").write_text("x")
    ws.list()
    _, changed = _step(ws, after3)
    assert changed == ["between.txt"]


def test_a_folder_swapped_for_a_link_shows_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the session's")
    root = tmp_path / "ws"
    (root / "a").mkdir(parents=True)
    ws = Workspace(root)
    before = ws.scan()
    (root / "a" / "secret.txt").write_text("made inside")  # an event names a/secret.txt …
    os.remove(root / "a" / "secret.txt")
    os.rmdir(root / "a")
    os.symlink(outside, root / "a")  # … which is now a link to another tree
    (root / "b").mkdir()  # a new folder the tracker will watch and walk …
    os.rmdir(root / "b")
    os.symlink(outside, root / "b")  # … is a link by the time it looks
    after, changed = _step(ws, before)
    assert after.files == {} and changed == []
    assert ws.tracker is not None
    fdinfo = Path(f"/proc/self/fdinfo/{ws.tracker.inotify.fd}").read_text()
    watched = {int(part[4:], 16) for part in fdinfo.split() if part.startswith("ino:") and len(part) > 4}
    assert os.stat(root).st_ino in watched and os.stat(outside).st_ino not in watched


def test_listing_pages_come_from_the_sorted_tracker(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root)
    ws = Workspace(root)
    ws.scan()
    everything = sorted(scan_tree(root).files)
    page, total = ws.list(offset=40, limit=10)
    assert total == 100 and [e.path for e in page] == everything[40:50]
    page, total = ws.list(prefix="d3", limit=5)
    assert total == 20 and [e.path for e in page] == [p for p in everything if p.startswith("d3/")][:5]
    (root / "d3" / "zz.txt").write_text("new")
    page, total = ws.list(prefix="d3", offset=20)
    assert total == 21 and [e.path for e in page] == ["d3/zz.txt"]


def test_no_inotify_means_walking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Tracker, "start", classmethod(lambda cls, root: None))
    root = tmp_path / "ws"
    root.mkdir()
    (root / "x.txt").write_text("1")
    ws = Workspace(root)
    assert list(ws.scan().files) == ["x.txt"] and ws.tracker is None and ws.untracked


def test_a_tracker_with_nothing_to_look_at_answers_at_once_and_only_then(tmp_path: Path) -> None:
    """``scan_now`` (what a call's result and the quota use on the event loop) answers when no
    event waits, says None while one does, and its answers match a walk."""
    ws = Workspace(tmp_path / "w")
    ws.create()
    ws.accounted = [tmp_path / "run"]
    ws.accounted[0].mkdir()
    assert ws.scan_now() is None and ws.accounted_scans_now() is None  # no tracker yet: walk first
    before = ws.scan()
    ws.accounted_scans()
    quiet = ws.scan_now()
    assert quiet is not None and quiet.files == before.files
    quiet_runtime = ws.accounted_scans_now()
    assert quiet_runtime is not None and quiet_runtime[0].files == {}
    (ws.root / "new.txt").write_text("x" * 5000)
    assert ws.scan_now() is None  # an event waits: the caller scans off the loop
    after = ws.scan()
    assert "new.txt" in after.files and changed_since(after, before, 0) == ["new.txt"]
    again = ws.scan_now()
    assert again is not None and again.bytes_used == scan_tree(ws.root).bytes_used
    (ws.accounted[0] / "fill").write_bytes(b"y" * 10000)
    assert ws.accounted_scans_now() is None
    runtime = ws.accounted_scans()
    assert runtime[0].bytes_used == scan_tree(ws.accounted[0]).bytes_used > 0
    now = ws.accounted_scans_now()
    assert now is not None and now[0].bytes_used == runtime[0].bytes_used
    ws.remove()


# --- a reset: the session's entries move into a warm kernel's directory --------------------------


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The roots the trackers walk from now on."""
    walked: list[Path] = []
    walk = Tracker._walk

    def counted(self: Tracker):  # type: ignore[no-untyped-def]
        walked.append(self.root)
        return walk(self)

    monkeypatch.setattr(Tracker, "_walk", counted)
    return walked


def _session_and_spare(tmp_path: Path) -> tuple[Workspace, Path]:
    home, spare = tmp_path / "home", tmp_path / "spare"
    home.mkdir()
    spare.mkdir()
    _tree(home)
    (home / "top.txt").write_text("at the top")
    return Workspace(home), spare


def test_a_root_replaced_by_a_warm_kernels_directory_is_followed_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``disk_store.rebind`` moves every entry into the warm kernel's directory, which then takes
    the root's name: every path stays, so the tracker follows (a walk of a big tree cost a reset
    143 ms at 20,000 files), and still sees what was written while the entries moved and after."""
    ws, spare = _session_and_spare(tmp_path)
    first = ws.scan()
    old_root = os.open(ws.root, os.O_RDONLY | os.O_DIRECTORY)  # as a stopping kernel's sandbox holds it
    walked = _walks(monkeypatch)

    def rebind_while_code_writes(home: Path, spare: Path) -> None:
        (home / "d1" / "before-the-move.txt").write_text("x")
        rebind(home, spare)
        (home / "d1" / "after-the-move.txt").write_text("y")

    ws.take_in(spare, rebind_while_code_writes)
    assert os.stat(ws.root).st_ino == os.stat(tmp_path / "home").st_ino != os.fstat(old_root).st_ino
    after, _ = _step(ws, first)
    assert {"d1/before-the-move.txt", "d1/after-the-move.txt", "top.txt"} <= after.files.keys()

    (ws.root / "new-top.txt").write_text("a new entry in the new root")
    (ws.root / "d2" / "f3.txt").write_text("edited")
    os.close(old_root)  # the old root goes away: its removal is not this tree's
    _, changed = _step(ws, after)
    assert changed == ["d2/f3.txt", "new-top.txt"]
    assert walked == []


def test_a_move_that_brings_other_entries_or_fails_makes_the_tracker_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, spare = _session_and_spare(tmp_path)
    first = ws.scan()
    (spare / "left-by-the-warm-kernel.txt").write_text("not the session's")
    walked = _walks(monkeypatch)
    ws.take_in(spare, rebind)
    after, _ = _step(ws, first)
    assert "left-by-the-warm-kernel.txt" in after.files
    assert walked == [ws.root]

    def failing(home: Path, spare: Path) -> None:
        os.rename(home / "d0", home.parent / "d0-elsewhere")
        raise OSError("EXDEV")

    spare2 = tmp_path / "spare2"
    spare2.mkdir()
    with pytest.raises(OSError, match="EXDEV"):
        ws.take_in(spare2, failing)
    gone, _ = _step(ws, after)
    assert not any(p.startswith("d0/") for p in gone.files)
    assert walked == [ws.root, ws.root]


def test_moves_while_code_keeps_changing_files_end_in_the_same_picture_as_a_walk(tmp_path: Path) -> None:
    """Garbage around the move: a thread creates, edits, deletes and renames files and folders,
    at the top and below, while the session's entries move back and forth between directories
    (a move that meets a new top-level entry fails, as ``rebind`` does on the server); each time
    the tracker ends up with what a walk finds."""
    ws, _ = _session_and_spare(tmp_path)
    ws.scan()
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            folder = ws.root / f"d{rng.randrange(5)}"
            name = f"c{rng.randrange(50)}"
            with contextlib.suppress(OSError):
                match rng.randrange(40):  # mostly below the top, where a move goes on
                    case 0:
                        (ws.root / f"top-{name}").write_text("y")
                    case 1:
                        (ws.root / f"top-{name}").unlink()
                    case 2:
                        (folder / f"sub-{name}").mkdir()
                    case 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 12:
                        os.rename(folder / name, folder / f"{name}-renamed")
                    case 13 | 14 | 15 | 16 | 17 | 18 | 19 | 20 | 21 | 22 | 23 | 24 | 25:
                        (folder / name).unlink()
                    case _:
                        (folder / name).write_text("x" * rng.randrange(9000))

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for i in range(100):
            spare = tmp_path / f"spare{i}"
            spare.mkdir()
            with contextlib.suppress(OSError):
                ws.take_in(spare, rebind)
            ws.scan()
    finally:
        stop.set()
        thread.join()
    last = ws.scan()
    truth = scan_tree(ws.root)
    assert last.files == truth.files and last.others == truth.others and last.bytes_used == truth.bytes_used


QUEUE = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text()) if sys.platform == "linux" else 0


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
@pytest.mark.skipif(not 0 < QUEUE <= 100_000, reason="inotify's queue here is too long to overflow cheaply")
def test_handing_a_big_tree_to_a_new_uid_overflows_no_tracker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset as root hands every file to the new interpreter's uid: an event per file. Left in
    inotify's queue they overflowed it, and an overflow makes every session's tracker walk."""
    big, small = tmp_path / "big", tmp_path / "small"
    for root in (big, small):
        (root / "d").mkdir(parents=True)
    for i in range(QUEUE + 2000):
        (big / "d" / f"f{i}").touch()
    (small / "d" / "kept.txt").write_text("another session's")
    session, other = Workspace(big), Workspace(small)
    session.scan()
    other.scan()
    walked = _walks(monkeypatch)
    session.hand_to(60_123)
    assert {os.lstat(big / "d" / f"f{i}").st_uid for i in (0, QUEUE)} == {60_123}
    assert other.scan().files.keys() == {"d/kept.txt"}
    assert session.scan().files == scan_tree(big).files
    assert walked == []

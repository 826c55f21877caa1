"""A stored session's files on a file system of their own, whose size and inode count the kernel caps.

Design: with ``--workspace-fs image`` (root, ``mkfs.ext4`` and loop devices), a stored session's
``files/`` is the mount point of ``files.img`` beside it: an ext4 image (a 4 MiB journal) whose
blocks are all reserved on the host (``_reserve``: a sparse one loses writes when the host fills),
made at the session's first load with room for the quota (``--workspace-mb``) and inodes for
``--workspace-files``, mounted ``nodev,nosuid`` while the session is live here and unmounted when
it goes. The file system answers "No space left on device" from the first block or name past it,
so no burst passes: the counting in ``quota.py`` still runs and still says why. A warm kernel's
directory (and a ``--stateless`` call's) is one too, ``ws-….img`` in the run directory: a new
session's first call moves that mount onto its ``files/`` (``adopt``), so it starts no kernel.
Each kernel's runtime directory (``/run/kernmind``: its sockets, and its variables while it saves
them) is a small image of its own, ``k-….img``, sized for ``--snapshot-mb``: sparse, since what
lasts there is written with ``fsync`` (a write-back the host cannot place fails the save, which
keeps the last snapshot) and the rest goes with the kernel.
Why an image and not project quotas, and what it costs: docs/security.md, "The disk".

A session stored before images were on (a plain ``files/`` with entries) keeps its directory and
the counting alone (logged). A server killed while images were mounted leaves the mounts: the
next server's ``unmount_leftovers`` removes those of the sessions no server holds, and
``unmount_under`` those in dead servers' run directories before they are removed.

Error policy: ``unavailable()`` says in a sentence why images cannot be used here; ``attach`` and
``detach`` raise ``OSError`` with the tool's own words (the caller refuses the load, or logs).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import re
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IMAGE = "files.img"  # beside the session's files/, out of its code's view
MIB = 1024 * 1024
INODE_BYTES = 256  # ext4's inode size: the inode table is part of the image's size
_OWN_MIB = 8  # the journal (4 MiB) and the rest of ext4's own bookkeeping on a small image
_TOOL_SECONDS = 60.0
_BUSY_TRIES = 3  # a kernel stopping in the background may still hold the mount for a moment
# Mounting by system call, not by running mount(8): a new session's first call pays for three.
_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE, _LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
_MS_NOSUID, _MS_NODEV, _MS_MOVE, _MNT_DETACH = 2, 4, 8192, 2
# struct loop_config {u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]}
_LOOP_CONFIG = struct.Struct("=II5Q4I64s64s32s2Q64x")
# No background zeroing of the inode tables: ext4 does it by "write zeroes" requests, which the loop
# device turns into holes punched in the image, giving back blocks the image reserved (_reserve).
_EXT4_OPTIONS = "noinit_itable"
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class WorkspaceFsUnavailable(RuntimeError):
    """``--workspace-fs image`` was asked for where images cannot be mounted (the sentence says why)."""


def check(mode: str) -> None:
    """Raise ``WorkspaceFsUnavailable`` when ``mode`` (``--workspace-fs``) cannot be served here."""
    if mode == "image" and (why := unavailable()) is not None:
        raise WorkspaceFsUnavailable(
            f"--workspace-fs image is not possible here: {why}; use --workspace-fs count"
        )


def unavailable() -> str | None:
    """None when per-session images can be made here; else why not, in a sentence."""
    if os.geteuid() != 0:
        return "per-session file systems need root (mounting a loop device)"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"per-session file systems need {', '.join(missing)} (Debian: e2fsprogs, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "per-session file systems need loop devices (/dev/loop-control is missing)"
    if _kernel_version() < (5, 8):
        return "per-session file systems need Linux 5.8 or later (LOOP_CONFIGURE)"
    return None


def _kernel_version() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def describe(mode: str, quota_mib: int, inodes: int, data_dir: Path | None = None) -> str:
    """What enforces a session's disk quota here, for ``kernmind doctor`` (with ``data_dir``: how many
    more images its disk can hold)."""
    why = unavailable()
    if mode == "image":
        if why is not None:
            return f"image asked for, but not possible: {why}"
        mib = image_mib(quota_mib, inodes)
        room = ""
        with contextlib.suppress(OSError):
            if data_dir is not None:
                disk = os.statvfs(next(p for p in (data_dir, *data_dir.parents) if p.exists()))
                room = f"; the data directory's disk has room for {disk.f_bavail * disk.f_frsize // (mib * MIB):,} more"
        return (
            f"image: each stored session's files are an ext4 file system of their own "
            f"({mib} MiB held on the disk, used or not; {inodes:,} names and a little more): the kernel "
            f"refuses what passes the quota{room}"
        )
    where = "possible here: --workspace-fs image" if why is None else f"not possible here: {why}"
    return f"count: measured around and during calls (sandbox above); per-session file systems {where}"


def image_mib(quota_mib: int, inodes: int) -> int:
    """The image's size: the quota and a margin (so the quota's own count, with its sentence, is
    normally reached first and the file system is the hard stop just past it), the inode table,
    the journal and ext4's own bookkeeping."""
    margin = 4 + quota_mib // 64
    return quota_mib + margin + _OWN_MIB + quota_mib // 256 + -(-inodes * INODE_BYTES // MIB)


def session_image(files: Path) -> Path:
    """Where a stored session's image lives: beside its ``files/``."""
    return files.parent / IMAGE


def has_image(files: Path) -> bool:
    return os.path.lexists(session_image(files))


def is_attached(root: Path) -> bool:
    return os.path.ismount(root)


def attach(root: Path, image: Path, *, quota_mib: int, inodes: int, reserve: bool = True) -> bool:
    """Mount ``image`` (made on first use; ``reserve``: all its blocks taken on the host) on ``root``;
    False when ``root`` keeps a plain directory (files stored before images were on). ``OSError``
    when it cannot be done."""
    if is_attached(root):
        return True
    if not image.exists():
        with contextlib.suppress(FileNotFoundError):
            if any(os.scandir(root)):
                log.info("session files in %s predate --workspace-fs image: counted, not capped", root)
                return False
        _make(image, image_mib(quota_mib, inodes), inodes + inodes // 50 + 64, reserve)
        root.mkdir(mode=0o700, exist_ok=True)
        _mount_new(image, root)  # (mounted nowhere else: it was just made)
    elif image.is_symlink() or not image.is_file():
        raise OSError(errno.EINVAL, f"{image} is not a regular file")
    else:
        _reserve(image)  # (one made sparse by an earlier version)
        root.mkdir(mode=0o700, exist_ok=True)
        mount(image, root)
    with contextlib.suppress(OSError):
        (root / "lost+found").rmdir()  # mkfs's, empty: not the session's
    return True


def mount(image: Path, root: Path) -> None:
    """Mount an existing ``image`` on ``root`` (a second mount of one image shares its loop device
    and its file system: util-linux reuses the device)."""
    _run("mount", "-t", "ext4", "-o", f"loop,nodev,nosuid,{_EXT4_OPTIONS}", str(image), str(root))


def detach(root: Path) -> None:
    """Unmount the image on ``root`` (lazily when something still holds it: a process that outlived
    its sandbox); its loop device goes with the last user. Nothing when none is mounted."""
    for attempt in range(_BUSY_TRIES):
        if not is_attached(root):
            return
        try:
            _syscall(_libc.umount2, os.fsencode(root), 0)
            return
        except OSError as exc:
            if attempt + 1 == _BUSY_TRIES:
                log.info("unmounting %s lazily: %s", root, exc)
            time.sleep(0.1 * (attempt + 1))
    _syscall(_libc.umount2, os.fsencode(root), _MNT_DETACH)


def remove_runtime(root: Path) -> None:
    """A kernel's runtime directory goes: its file system unmounted (``--workspace-fs image``), the
    directory and its image removed; a failure is logged (the run directory's clean-up retries)."""
    if is_attached(root):
        detach_quietly(root)
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.with_name(root.name + ".img").unlink()


def detach_quietly(root: Path) -> None:
    """``detach``, a failure logged (the mount stays: the next server's clean-up takes it)."""
    try:
        detach(root)
    except OSError as exc:
        log.warning("%s stays mounted: %s", root, exc)


def adopt(spare: Path, spare_image: Path, root: Path, image: Path) -> None:
    """Make the (empty) file system on ``spare`` — a warm kernel's, bound in its sandbox — the one
    on ``root`` (a new session's, empty too), its image renamed to ``image``. A running sandbox
    keeps writing into a mount the host moves. ``OSError`` (``EXDEV``: the two directories on
    different file systems) before anything changed."""
    os.replace(spare_image, image)  # the session's fresh one goes when it is unmounted below
    detach(root)
    try:
        _syscall(_libc.mount, os.fsencode(spare), os.fsencode(root), None, _MS_MOVE, None)
    except OSError as exc:  # (a shared parent mount refuses moves): mount it again, then let go of it there
        log.debug("moving the mount on %s: %s; mounting its image again instead", spare, exc)
        mount(image, root)
        detach(spare)
    with contextlib.suppress(OSError):
        spare.rmdir()


def unmount_under(root: Path) -> int:
    """Unmount every file system mounted under ``root`` (a dead server's run directory, before it is
    removed: a removal must never reach into a mount); how many."""
    return _detach_all(sorted(_points_under(root), key=len, reverse=True))


def unmount_leftovers(sessions_root: Path, held: Callable[[Path], bool]) -> int:
    """Unmount the session images a killed server left mounted under ``sessions_root`` (those of
    sessions ``held`` says no server holds now); how many."""
    points = _points_under(sessions_root)
    return _detach_all([p for p in points if os.path.basename(p) == "files" and not held(Path(p).parent)])


def _detach_all(points: list[str]) -> int:
    done = 0
    for point in points:
        try:
            detach(Path(point))
            done += 1
        except OSError as exc:
            log.warning("a file system left mounted at %s: %s", point, exc)
    return done


def _points_under(root: Path) -> list[str]:
    prefix = os.path.realpath(root) + os.sep
    return [point for point in _mount_points() if point.startswith(prefix)]


def _mount_points() -> list[str]:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    # Field 5 is the mount point, with spaces and the like written as octal escapes.
    return [_unescape(line.split()[4]) for line in lines if len(line.split()) > 4]


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _reserve(image: Path, size: int | None = None) -> None:
    """Give ``image`` all its blocks on the host now. A sparse image would take them only when the
    file system inside writes back, seconds after the code's write succeeded: on a host disk that
    fills meanwhile, that write-back fails and the file system loses what the code wrote."""
    fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size if size is None else size
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise OSError(
                errno.ENOSPC,
                f"the data directory's disk has less than the {-(-size // MIB)} MiB this session's file "
                "system reserves (--workspace-mb, --workspace-files)",
            ) from exc
    finally:
        os.close(fd)


def _make(image: Path, mib: int, inodes: int, reserve: bool = True) -> None:
    part = image.with_name(image.name + ".part")
    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
    try:
        if reserve:
            _reserve(part, mib * MIB)
        else:
            os.truncate(part, mib * MIB)
        options = ["-b", "4096", "-I", str(INODE_BYTES), "-N", str(inodes), "-m", "0"]
        # A small journal, so a server killed mid-write leaves a file system that mounts clean; the
        # image's reserved blocks read as zeros, so the journal and inode tables need no zeroing.
        features = [
            "-J",
            "size=4",
            "-O",
            "^resize_inode",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
        ]
        _run("mkfs.ext4", "-q", "-F", *options, *features, str(part))
        os.replace(part, image)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _mount_new(image: Path, root: Path) -> None:
    """Mount an image that is mounted nowhere (``mount`` shares a loop device with an earlier mount of
    the same image; this always takes a free one): a loop device that goes with the last unmount."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(8):  # another process may take the free device first
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                loop = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
                try:
                    config = _LOOP_CONFIG.pack(
                        backing, 0, 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0
                    )
                    try:
                        fcntl.ioctl(loop, _LOOP_CONFIGURE, config)
                    except OSError as exc:
                        if exc.errno == errno.EBUSY:
                            continue
                        raise
                    flags = _MS_NODEV | _MS_NOSUID
                    _syscall(
                        _libc.mount,
                        f"/dev/loop{number}".encode(),
                        os.fsencode(root),
                        b"ext4",
                        flags,
                        _EXT4_OPTIONS.encode(),
                    )
                    return
                finally:
                    os.close(loop)  # (a device that was not mounted is cleared with its last descriptor)
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(backing)
    finally:
        os.close(control)


def _syscall(function: Callable[..., int], *args: object) -> None:
    if function(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{function.__name__}: {os.strerror(code)}")


def _run(*argv: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(errno.EIO, f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise OSError(errno.EIO, f"{argv[0]} failed: {said[-1] if said else f'exit {done.returncode}'}")

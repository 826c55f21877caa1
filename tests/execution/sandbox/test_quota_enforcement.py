"""What the kernel refuses a sandbox over its workspace quota, and what it still lets through.

Real bubblewrap sandboxes with kernmind's seccomp filters (``seccomp.py``), started the way a
session's sandbox starts (``Sandbox.wrap`` with its limits): while the session is over its
quota (``Limits.writes_blocked``) no file grows (RLIMIT_FSIZE 0) and nothing is created
(the stricter filter: ``mkdir``, links, device nodes, ``O_CREAT``); ``fallocate`` modes a
file-size limit cannot bound are refused always. Deleting, renaming, truncating and reading
work, so code can clean up. The session-level view (a real server, its quota note) is in
tests/security/test_session_limits.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from kernmind.execution.sandbox import seccomp
from kernmind.execution.sandbox.bwrap import Sandbox
from tests.execution.sandbox import name_makers

SANDBOX = Sandbox.detect("auto")
needs_filter = pytest.mark.skipif(
    not SANDBOX.isolated or SANDBOX.seccomp is None,
    reason=f"no bubblewrap sandbox with the seccomp filter here: {SANDBOX.reason}",
)
MIB = 2**20
NOT_SUPPORTED = errno.errorcode[errno.EOPNOTSUPP]  # Python names 95 ENOTSUP

# Runs inside the sandbox: every attempt, its errno name (or "ok"), and the disk blocks used after.
PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
out = {}

def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def many_dirs():
    for i in range(10_000):
        os.mkdir(f"dir{i}")

def deep_tree():
    os.makedirs("/".join(["deep"] * 200))

def fallocate(mode, size=100 * 2**20):
    fd = os.open("existing", os.O_RDWR)
    try:
        if libc.fallocate(fd, mode, 0, size) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    finally:
        os.close(fd)

def used():
    total = 0
    for root, dirs, files in os.walk("."):
        for name in dirs + files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total

before = used()
attempt("mkdir_10000", many_dirs)
out["dirs_made"] = sum(1 for n in os.listdir(".") if n.startswith("dir"))
attempt("deep_tree", deep_tree)
attempt("symlink", lambda: os.symlink("existing", "link"))
attempt("hardlink", lambda: os.link("existing", "hard"))
attempt("fifo", lambda: os.mkfifo("fifo"))
attempt("create", lambda: open("new.txt", "w").close())
attempt("fallocate_100mb", lambda: fallocate(0))
attempt("fallocate_keep_size_100mb", lambda: fallocate(1))  # FALLOC_FL_KEEP_SIZE
attempt("punch_hole", lambda: fallocate(3, 4096))  # PUNCH_HOLE | KEEP_SIZE: frees
def append(size=4096):
    fd = os.open("existing", os.O_WRONLY | os.O_APPEND)  # no O_CREAT: the file exists
    try:
        os.write(fd, b"x" * size)
    finally:
        os.close(fd)

attempt("write", append)
attempt("open_w_existing", lambda: open("scratch", "w").close())  # O_CREAT, even on a file that exists
attempt("read", lambda: open("victim", "rb").read())
attempt("rename", lambda: os.rename("victim", "renamed"))
attempt("truncate", lambda: os.truncate("big", 0))
attempt("remove", lambda: os.remove("renamed"))
attempt("rmdir", lambda: os.rmdir("olddir"))
out["grew_by"] = used() - before
print(json.dumps(out))
"""


def run_probe(workspace: Path, *, over_quota: bool, sandbox: Sandbox = SANDBOX) -> dict[str, object]:
    (workspace / "existing").write_bytes(b"")
    (workspace / "scratch").write_bytes(b"")
    (workspace / "victim").write_bytes(b"v" * 100)
    (workspace / "big").write_bytes(b"b" * MIB)
    (workspace / "olddir").mkdir()
    uid = sandbox.allocate_uid()
    if uid is not None:
        for path in [workspace, *workspace.iterdir()]:
            os.chown(path, uid, uid)
    limits = replace(sandbox.limits, writes_blocked=over_quota)
    cmd = sandbox.wrap(["/usr/bin/python3", "-c", PROBE], workspace=workspace, uid=uid, limits=limits)
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_filter_programs_for_known_machines_stay_whole_and_within_jump_range() -> None:
    for machine in ("x86_64", "aarch64"):
        ordinary = seccomp.program(machine)
        strict = seccomp.program(machine, over_quota=True)
        assert ordinary is not None and strict is not None
        assert len(ordinary) % 8 == 0 and len(strict) % 8 == 0
        assert len(strict) > len(ordinary)  # the creating calls come on top
    assert seccomp.program("mips", over_quota=True) is None


@needs_filter
def test_over_quota_nothing_is_created_nor_preallocated_and_clean_up_works(tmp_path: Path) -> None:
    check_over_quota(run_probe(tmp_path, over_quota=True))


def check_over_quota(out: dict[str, object]) -> None:
    # Not 10,000 directories, not one: the first mkdir is refused with "Disk quota exceeded".
    assert out["mkdir_10000"] == "EDQUOT" and out["dirs_made"] == 0, out
    for name in ("deep_tree", "symlink", "hardlink", "fifo", "create"):
        assert out[name] == "EDQUOT", (name, out)
    assert out["fallocate_100mb"] == "EFBIG", out  # the size would grow: RLIMIT_FSIZE 0
    assert out["fallocate_keep_size_100mb"] == NOT_SUPPORTED, out
    assert out["write"] == "EFBIG", out
    assert out["open_w_existing"] == "EDQUOT", out  # truncate with os.truncate instead
    # Cleaning up works: reading, freeing blocks, renaming, truncating, deleting.
    for name in ("read", "punch_hole", "rename", "truncate", "remove", "rmdir"):
        assert out[name] == "ok", (name, out)
    assert isinstance(out["grew_by"], int) and out["grew_by"] < 0, out  # only shrank


@needs_filter
def test_under_quota_ordinary_work_goes_on(tmp_path: Path) -> None:
    """The ordinary filter refuses only the preallocation a file-size limit cannot bound."""
    out = run_probe(tmp_path, over_quota=False)
    assert out["mkdir_10000"] == "ok" and out["dirs_made"] == 10_000, out
    for name in (
        "deep_tree",
        "symlink",
        "hardlink",
        "fifo",
        "create",
        "fallocate_100mb",
        "write",
        "open_w_existing",
    ):
        assert out[name] == "ok", (name, out)
    assert out["fallocate_keep_size_100mb"] == NOT_SUPPORTED, out
    assert isinstance(out["grew_by"], int) and out["grew_by"] > 100 * MIB, out


@needs_filter
def test_sandboxes_pick_their_filter_by_the_sessions_state() -> None:
    blocked = replace(SANDBOX.limits, writes_blocked=True)
    assert SANDBOX.seccomp_for(SANDBOX.limits) == SANDBOX.seccomp
    strict = SANDBOX.seccomp_for(blocked)
    assert strict is not None and strict != SANDBOX.seccomp
    assert Path(strict).read_bytes() == seccomp.program(over_quota=True)


def run_name_makers(workspace: Path, *, over_quota: bool, sandbox: Sandbox = SANDBOX) -> dict[str, str]:
    """``name_makers.PROBE`` in a sandbox started under or over the quota, ``SETUP`` done first by
    the host (as the sandbox's uid)."""
    uid = sandbox.allocate_uid()
    subprocess.run(["/usr/bin/python3", "-c", name_makers.SETUP], cwd=workspace, check=True)
    if uid is not None:
        for path in [workspace, *workspace.iterdir()]:
            os.chown(path, uid, uid)
    limits = replace(sandbox.limits, writes_blocked=over_quota)
    cmd = sandbox.wrap(
        ["/usr/bin/python3", "-c", name_makers.PROBE], workspace=workspace, uid=uid, limits=limits
    )
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return name_makers.parse(proc.stdout)


@needs_filter
def test_over_quota_every_call_that_makes_a_name_is_refused_and_io_uring_is_off(tmp_path: Path) -> None:
    """Each family on its own, by ``syscall(2)``: O_CREAT and O_TMPFILE through openat and openat2,
    mkdirat, mknodat, symlinkat, linkat, renameat2(RENAME_WHITEOUT), bind of a Unix socket,
    setxattr. Under the quota each works (the control: the call is real and reaches the disk)."""
    (tmp_path / "under").mkdir()
    under = run_name_makers(tmp_path / "under", over_quota=False)
    for family in name_makers.FAMILIES:
        if family == "setxattr" and under[family] in ("ENOTSUP", "EOPNOTSUPP"):
            continue  # no user attributes on this file system
        assert under[family] == "ok", (family, under)
    (tmp_path / "over").mkdir()
    over = run_name_makers(tmp_path / "over", over_quota=True)
    for family in name_makers.FAMILIES:
        expected = "ENOSYS" if family.startswith("openat2") else "EDQUOT"  # openat2: libc falls back
        assert over[family] == expected, (family, over)
    assert sorted(os.listdir(tmp_path / "over")) == ["p_existing", "p_moved_from", "p_xattr_target"]
    for out in (under, over):
        for call in name_makers.IO_URING:
            assert out[call] == "ENOSYS", (call, out)


def test_without_bubblewrap_the_filter_still_holds_and_doctor_says_what_is_missing(tmp_path: Path) -> None:
    """``--sandbox none``: no namespaces, but the lifeline parent loads the same filters, so a
    session over its quota is held back the same way (code still runs as the server's user)."""
    none = Sandbox.detect("none")
    if none.seccomp is None:
        pytest.skip("seccomp filters cannot be loaded on this machine")
    strict = none.seccomp_for(replace(none.limits, writes_blocked=True))
    assert strict is not None and Path(strict).read_bytes() == seccomp.program(over_quota=True)
    check_over_quota(run_probe(tmp_path, over_quota=True, sandbox=none))
    assert "runs as the server's user" in str(none.describe()["quota"])


def test_where_no_filter_can_be_loaded_doctor_names_the_gap() -> None:
    bare = Sandbox("none", "disabled with --sandbox none", allow_network=True)
    assert bare.seccomp_for(replace(bare.limits, writes_blocked=True)) is None
    described = bare.describe()
    assert described["seccomp"] is None
    assert "no seccomp filter" in str(described["quota"]) and "raise its own" in str(described["quota"])


def test_doctor_says_how_the_quota_is_counted_and_whether_io_uring_is_off() -> None:
    counts = str(SANDBOX.describe()["quota_counts"])
    assert "every file, directory, link" in counts and "--workspace-files" in counts and "O_TMPFILE" in counts
    bare = Sandbox("none", "disabled with --sandbox none", allow_network=True)
    assert str(bare.describe()["io_uring"]).startswith("not filtered")
    if SANDBOX.seccomp is not None:
        assert str(SANDBOX.describe()["io_uring"]).startswith("off in every sandbox")

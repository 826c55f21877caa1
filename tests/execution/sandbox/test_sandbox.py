"""The sandbox layer on its own: what a wrapped command can see, and how modes are chosen."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from kernmind.execution.parts import private_paths
from kernmind.execution.sandbox.bwrap import Sandbox, SandboxUnavailable
from tests.conftest import make_settings

bwrap_only = pytest.mark.skipif(
    Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"
)


def run_in(
    sandbox: Sandbox, workspace: Path, argv: list[str], **kw: object
) -> subprocess.CompletedProcess[str]:
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(workspace, uid, uid)
    cmd = sandbox.wrap(argv, workspace=workspace, uid=uid, **kw)  # type: ignore[arg-type]
    return subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=30)


@bwrap_only
def test_workspace_is_the_only_writable_place_and_is_mounted_at_workspace(tmp_path: Path) -> None:
    proc = run_in(
        Sandbox.detect("bwrap"),
        tmp_path,
        ["/bin/sh", "-c", "pwd; echo hi > f; touch /usr/x 2>/dev/null || echo ro"],
    )
    assert proc.stdout.split() == ["/workspace", "ro"]
    assert (tmp_path / "f").read_text() == "hi\n"


@bwrap_only
def test_read_only_paths_under_tmp_survive_the_private_tmpfs(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o755)
    (runtime / "lib.txt").write_text("visible")
    (runtime / "lib.txt").chmod(0o644)
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = run_in(Sandbox.detect("bwrap"), ws, ["cat", str(runtime / "lib.txt")], ro_paths=[runtime])
    assert proc.stdout == "visible"


@bwrap_only
@pytest.mark.parametrize("ro_path", ["/tmp", "/tmp/", "/"])
def test_a_read_only_path_holding_tmp_never_shows_the_hosts_tmp(tmp_path: Path, ro_path: str) -> None:
    """A server started with ``PYTHONPATH=/tmp`` once laid the host's /tmp, read-only, over the private one."""
    fd, host_file = tempfile.mkstemp(prefix="another-sessions-file-", dir="/tmp")  # readable by all
    os.fchmod(fd, 0o644)
    os.close(fd)
    ws = tmp_path / "ws"
    ws.mkdir()
    script = f"cat {host_file} 2>/dev/null && echo seen || echo hidden; echo x > /tmp/own && echo writable"
    try:
        proc = run_in(Sandbox.detect("bwrap"), ws, ["/bin/sh", "-c", script], ro_paths=[ro_path])
    finally:
        os.unlink(host_file)
    assert proc.stdout.split() == ["hidden", "writable"]


@bwrap_only
def test_a_read_only_path_holding_the_workspace_never_shows_other_sessions(tmp_path: Path) -> None:
    """A server started with ``PYTHONPATH=$HOME`` would have shown its whole data directory."""
    data = tmp_path / "data"
    (data / "sessions" / "other").mkdir(parents=True)
    (data / "sessions" / "other" / "notes.txt").write_text("another session's file")
    (data / "memory.db").write_text("every note")
    ws = data / "sessions" / "mine"
    ws.mkdir()
    for d in (tmp_path, data, data / "sessions", data / "sessions" / "other"):
        d.chmod(0o755)
    for f in (data / "memory.db", data / "sessions" / "other" / "notes.txt"):
        f.chmod(0o644)
    script = f"cat {data}/memory.db {data}/sessions/other/notes.txt 2>/dev/null || echo hidden; pwd"
    proc = run_in(Sandbox.detect("bwrap"), ws, ["/bin/sh", "-c", script], ro_paths=[data, tmp_path])
    assert proc.stdout.split() == ["hidden", "/workspace"]


@bwrap_only
def test_a_read_only_path_holding_the_memory_database_never_shows_it(tmp_path: Path) -> None:
    """The memory database (``--db`` outside the data directory), a tokens file and the data directory
    are the server's private paths (``parts.private_paths``): no read-only bind shows them."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "km.db").write_text("every note")
    (notes / "helper.py").write_text("")
    for path, mode in (
        (tmp_path, 0o755),
        (notes, 0o755),
        (notes / "km.db", 0o644),
        (notes / "helper.py", 0o644),
    ):
        path.chmod(mode)
    settings = make_settings(tmp_path / "data", db=notes / "km.db")
    sandbox = Sandbox.detect("bwrap")
    sandbox.private = private_paths(settings)
    assert str(notes / "km.db") in sandbox.private and str(tmp_path / "data") in sandbox.private
    ws = tmp_path / "ws"
    ws.mkdir()
    script = f"cat {notes}/km.db 2>/dev/null || echo hidden"
    proc = run_in(sandbox, ws, ["/bin/sh", "-c", script], ro_paths=[notes])
    assert proc.stdout.split() == ["hidden"]


@bwrap_only
@pytest.mark.parametrize("through", ["data_dir", "ro_path"])
def test_a_link_does_not_hide_the_data_directory_from_the_check(tmp_path: Path, through: str) -> None:
    """bwrap follows links: a read-only path that is a link to a folder holding the data directory (or a
    data directory named through a link, with the real folder above it on the path) must hide it too."""
    real = tmp_path / "home"
    (real / "data").mkdir(parents=True)
    (real / "data" / "memory.db").write_text("every note")
    link = tmp_path / "link"
    link.symlink_to(real)
    for path, mode in (
        (tmp_path, 0o755),
        (real, 0o755),
        (real / "data", 0o755),
        (real / "data" / "memory.db", 0o644),
    ):
        path.chmod(mode)
    data_dir, ro_path = (link / "data", real) if through == "data_dir" else (real / "data", link)
    sandbox = Sandbox.detect("bwrap")
    sandbox.private = private_paths(make_settings(data_dir))
    ws = tmp_path / "ws"
    ws.mkdir()
    script = f"cat {real}/data/memory.db {link}/data/memory.db 2>/dev/null || echo hidden"
    proc = run_in(sandbox, ws, ["/bin/sh", "-c", script], ro_paths=[ro_path])
    assert proc.stdout.split() == ["hidden"]


@bwrap_only
def test_environment_is_allow_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNMIND_SECRET_FOR_TEST", "leak")
    proc = run_in(Sandbox.detect("bwrap"), tmp_path, ["env"], env={"EXTRA": "1"})
    names = {line.split("=", 1)[0] for line in proc.stdout.splitlines()}
    assert "KERNMIND_SECRET_FOR_TEST" not in names
    assert {"PATH", "HOME", "LANG", "EXTRA"} <= names


@bwrap_only
def test_network_is_off_unless_allowed(tmp_path: Path) -> None:
    script = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    off = run_in(Sandbox.detect("bwrap"), tmp_path, ["python3", "-c", script])
    assert off.stdout.strip() == "['lo']"
    on = run_in(Sandbox.detect("bwrap", allow_network=True), tmp_path, ["python3", "-c", script])
    assert on.stdout.strip() != "['lo']"


def test_none_mode_keeps_limits_and_clean_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNMIND_SECRET_FOR_TEST", "leak")
    sandbox = Sandbox.detect("none")
    assert sandbox.backend == "none"
    proc = run_in(sandbox, tmp_path, ["/bin/sh", "-c", "env; ulimit -n"])
    assert "KERNMIND_SECRET_FOR_TEST" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == str(sandbox.limits.max_open_files)


def test_required_mode_refuses_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        Sandbox.detect("required")
    fallback = Sandbox.detect("auto")
    assert fallback.backend == "none" and "bwrap is not installed" in fallback.reason

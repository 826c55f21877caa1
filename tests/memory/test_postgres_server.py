"""The test PostgreSQL helper cleans up after test processes that were killed before stopping theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.memory.postgres_server import PostgresServer, postgres_bin, reap_left_behind
from tests.transport.procs import wait_until

# once, not once per memory backend: this is the helper that gives the tests their PostgreSQL
pytestmark = [pytest.mark.fast, pytest.mark.sqlite_only("the test PostgreSQL helper itself")]


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's first process may never reap the stopped server)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_processs_server_directory_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    left = tmp_path / f"km-pg-{dead_pid()}-abc"
    (left / "data").mkdir(parents=True)
    ours = tmp_path / f"km-pg-{os.getpid()}-def"
    ours.mkdir()
    unrelated = tmp_path / "km-pg-oldstyle"
    unrelated.mkdir()
    assert reap_left_behind(tmp_path, Path("/nonexistent/pg_ctl"), []) == [left]
    assert not left.exists() and ours.exists() and unrelated.exists()


@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed")
def test_a_server_left_running_by_a_killed_process_is_stopped(tmp_path: Path) -> None:
    server = PostgresServer().start()
    owner = int(server.dir.name.split("-")[2])
    assert owner == os.getpid()
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    renamed = server.dir.with_name(f"km-pg-{dead_pid()}-left")
    try:
        os.rename(server.dir, renamed)  # as if its owner had died: the server runs on from the new path
        assert reap_left_behind(renamed.parent, server.bindir / "pg_ctl", server._as_user) == [renamed]
        assert not renamed.exists()
        assert wait_until(lambda: not running(pid), timeout=10), "the left-behind server still runs"
    finally:
        server.dir = renamed
        server.stop()

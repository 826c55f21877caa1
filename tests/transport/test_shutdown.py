"""Clean shutdown: stdin EOF, SIGTERM and SIGINT stop every kernel and leave the DB clean.

Each case starts a real ``kernmind serve`` (stdio or HTTP), gives it two kernel sessions
(one of them busy in a long call when the server is told to stop), writes memory, then
ends it and checks, by listing processes in /proc, that nothing it started survives:
no bwrap, no setpriv, no ``ipykernel_launcher``, no fork-server template or forked kernel (by pid + start time, and by any process
whose command line names the test's data directory). The database must be checkpointed
(no WAL left behind), pass ``integrity_check`` and hold what was written; workspaces and
the kernels' runtime directories (in the server's private TMPDIR) must be gone.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from mcp.types import CallToolResult

from kernmind.execution.sandbox.rundir import socket_root
from tests.transport.procs import ProcInfo, StdioServer, descendants, mentioning, start_http, wait_until

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

STOP_WITHIN = 60.0  # a bound on a hang from the stop request to process exit (graceful wait is 3 s)
RUNTIME_BIND = re.compile(r"--bind (\S+) /run/kernmind ")  # a kernel's socket directory on the host
MARK = "kept-through-shutdown-7f3a"
TEMPLATE = "forkserver/template.py"  # the fork server's processes (see forked_kernel below)


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _kernel_tree(pid: int, kernels: int) -> tuple[list[ProcInfo], set[Path]]:
    """Every process below the server, and the kernels' runtime directories."""
    procs = descendants(pid)

    def forked_kernel(p: ProcInfo) -> bool:
        """A fork-server kernel: a fork of the template inside a sandbox's pid namespace (its
        parent, the waiter, may have been reparented: a kernel forked by the template's snapshot
        outlives the snapshot, which exits once the template's preloads are in)."""
        return TEMPLATE in p.cmdline and pid_namespace(p.pid) not in (None, pid_namespace(pid))

    interpreters = [
        p
        for p in procs
        if ("ipykernel_launcher" in p.cmdline and "bwrap" not in p.cmdline.split()[0]) or forked_kernel(p)
    ]
    runtime_dirs = {Path(m.group(1)) for p in procs if (m := RUNTIME_BIND.search(p.cmdline))}
    assert len(interpreters) >= kernels, [p.cmdline[:200] for p in procs]
    assert len(runtime_dirs) >= kernels, runtime_dirs
    return procs, runtime_dirs


def _assert_clean(data_dir: Path, before: list[ProcInfo], runtime_dirs: set[Path], log: str) -> None:
    assert "Traceback" not in log, log
    # No process the server started is still alive (checked right away: the server waits for them).
    assert wait_until(lambda: not [p for p in before if p.alive()], 3.0), [
        (p.pid, p.cmdline[:120]) for p in before if p.alive()
    ]
    assert not mentioning(str(data_dir)), mentioning(str(data_dir))
    for d in runtime_dirs:
        assert not d.exists(), f"kernel runtime directory left behind: {d}"
    # Kernel state lives in the server's own run directory (under the data dir, or under a short
    # /tmp/kernmind-<uid>-… root when the data dir is too deep for unix socket paths), which is
    # removed with the server; nothing goes to the server's TMPDIR.
    roots = {data_dir / "workspaces", socket_root(data_dir / "workspaces")}
    assert all(d.parents[1] in roots for d in runtime_dirs), runtime_dirs
    assert not any(d.parent.exists() for d in runtime_dirs), "the server's run directory was left behind"
    tmpdir = data_dir.parent / "tmp"
    assert not list(tmpdir.iterdir()), f"left in the server's TMPDIR: {list(tmpdir.iterdir())}"
    workspaces = data_dir / "workspaces"
    assert not workspaces.exists() or not any(workspaces.iterdir()), list(workspaces.iterdir())
    db = data_dir / "kernmind.db"
    assert db.exists()
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "WAL not checkpointed: the database was not closed"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert any(MARK in line for line in con.iterdump()), "memory written before the stop is missing"
    finally:
        con.close()


# --- stdio ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["stdin-eof", "SIGTERM", "SIGINT"])
def test_stdio_shutdown_leaves_nothing_behind(tmp_path: Path, how: str) -> None:
    server = StdioServer.start(tmp_path)
    try:
        out = server.call_tool("run_code", {"code": "a = 1; a"})
        assert out["structuredContent"]["results"][0]["text"] == "1"
        server.call_tool("run_code", {"code": "import time", "session_id": "busy"})
        server.call_tool("memory_create", {"label": "shutdown", "value": MARK})
        # A call still running when the stop arrives must not hold the shutdown up.
        server._send(
            {
                "jsonrpc": "2.0",
                "id": 999,
                "method": "tools/call",
                "params": {
                    "name": "run_code",
                    "arguments": {
                        "code": "print('sleeping', flush=True); time.sleep(60)",
                        "session_id": "busy",
                    },
                    "_meta": {"progressToken": "busy"},
                },
            }
        )
        # the stop is sent once the server reports the call running (its progress), not after a sleep
        server.wait_for_note(
            lambda m: (
                m.get("method") == "notifications/progress"
                and "sleeping" in (m.get("params", {}).get("message") or "")
            )
        )
        before, runtime_dirs = _kernel_tree(server.proc.pid, kernels=2)

        t0 = time.monotonic()
        if how == "stdin-eof":
            server.close_stdin()
        else:
            server.proc.send_signal(getattr(signal, how))
        rc = server.wait(STOP_WITHIN)
        took = time.monotonic() - t0
    finally:
        server.kill()
    log = server.log.read_text(errors="replace")
    assert rc == 0, log
    assert took < STOP_WITHIN
    _assert_clean(server.data_dir, before, runtime_dirs, log)


# --- HTTP -------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize(("how", "era"), [("SIGTERM", "legacy"), ("SIGINT", "auto")])
async def test_http_shutdown_leaves_nothing_behind(tmp_path: Path, how: str, era: str) -> None:
    """The stop arrives while a call runs (known from its progress, not from a sleep): the call
    answers that the server is shutting down, then everything stops and nothing is left.

    The stop is sent only once the server reports the call running: a stop that races the
    request itself (still unwritten, or written onto a kept-alive connection as the server
    closes it) is answered by the drain with a 503 while the server drains, and after that by
    a refused connection, which the SDK's client raises from its exit (transport/drain.py).
    """
    server = start_http(tmp_path, token="shutdown-token")
    try:
        with anyio.fail_after(90):
            async with server.client("legacy") as legacy, server.client("auto") as modern:
                await legacy.call_tool("run_code", {"code": "import time", "session_id": "busy"})
                await modern.call_tool("run_code", {"code": "b = 2"})
                r = await modern.call_tool("memory_create", {"label": "shutdown", "value": MARK})
                assert not r.is_error, r
                before, runtime_dirs = _kernel_tree(server.proc.pid, kernels=2)

                outcome: dict[str, object] = {}
                running, answered = anyio.Event(), anyio.Event()

                async def progress(done: float, total: float | None, message: str | None) -> None:
                    if message and "sleeping" in message:
                        running.set()

                caller = legacy if era == "legacy" else modern  # a session's stream, or a sessionless POST

                async def long_call() -> None:
                    try:
                        outcome["result"] = await caller.call_tool(
                            "run_code",
                            {"code": "print('sleeping', flush=True); time.sleep(60)", "session_id": "busy"},
                            progress_callback=progress,
                        )
                    except Exception as exc:  # recorded: the assertion below says what was expected
                        outcome["error"] = exc
                    answered.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_call)
                    await running.wait()
                    t0 = time.monotonic()
                    server.proc.send_signal(getattr(signal, how))
                    rc = await anyio.to_thread.run_sync(server.proc.wait, STOP_WITHIN)
                    took = time.monotonic() - t0
                    with anyio.fail_after(5):  # its answer was sent before the server closed
                        await answered.wait()
    except BaseException:
        if server.proc.poll() is None:
            server.proc.kill()
        raise
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log_text()
    assert rc == 0, log
    assert took < STOP_WITHIN, took
    # The running call answered with a result that says why it stopped, not a cut stream.
    result = outcome.get("result")
    assert isinstance(result, CallToolResult), outcome
    structured = result.structured_content or {}
    assert structured.get("status") == "error", structured
    assert structured["error"]["name"] == "ServerShuttingDown", structured["error"]
    assert "shutting down" in structured["error"]["value"], structured["error"]
    _assert_clean(server.data_dir, before, runtime_dirs, log)

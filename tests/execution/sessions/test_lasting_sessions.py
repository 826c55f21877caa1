"""Sessions that last: files and variables survive a server's stop, its death and idle time.

Real ``kernmind serve`` processes on one data dir, stopped with SIGTERM or killed with
SIGKILL, then a new server on the same data dir; the stored-session lock between two live
servers; caps; the ``kernmind sessions`` command line; and a tampered snapshot that runs
inside the sandbox only.
"""

from __future__ import annotations

import json
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured
from tests.execution.fakes import fake_client, fake_settings
from tests.transport.procs import StdioServer, run_cli

pytestmark = [pytest.mark.xdist_group("transport")]

ANALYSIS = """\
import numpy as np, pandas as pd
from sklearn.linear_model import LogisticRegression
rng = np.random.default_rng(0)
df = pd.DataFrame(rng.normal(size=(200, 3)), columns=list("abc"))
model = LogisticRegression().fit(df[["a", "b"]], df.c > 0)
scale = 3
def f(x):
    return x * scale
class Point:
    def __init__(self, x):
        self.x = x
p = Point(4)
gen = (i for i in range(3))
df.to_csv("data.csv", index=False)
open("notes.txt", "w").write("kept")
"""

CHECK = """\
scale = 10
(df.shape, int(model.predict(df[["a", "b"]].head(1))[0] in (0, 1)), f(2), p.x, isinstance(p, Point),
 sorted(__import__("os").listdir()))
"""


def sandboxed() -> bool:
    return Sandbox.detect("auto").isolated


def run(server: StdioServer, code: str, **kw: Any) -> dict[str, Any]:
    out = server.call_tool("run_code", {"code": code, **kw})["structuredContent"]
    assert out["status"] == "ok", out
    return out


def text(out: dict[str, Any]) -> str:
    return out["results"][0]["text"]


def test_sigterm_keeps_files_and_variables_and_the_next_server_resumes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = StdioServer.start(tmp_path / "a", data_dir=data)
    try:
        run(first, ANALYSIS, session_id="analysis")
        first.call_tool("upload_file", {"path": "up.txt", "content": "uploaded", "session_id": "analysis"})
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
    finally:
        first.kill()

    second = StdioServer.start(tmp_path / "b", data_dir=data)
    try:
        listed = second.call_tool("list_sessions", {})["structuredContent"]["sessions"]
        [row] = [s for s in listed if s["session_id"] == "analysis"]
        assert row["state"] == "stored" and row["workspace_files"] >= 3 and row["variables_saved_at"]
        files = second.call_tool("list_files", {"session_id": "analysis"})["structuredContent"]["files"]
        assert {"data.csv", "notes.txt", "up.txt"} <= {f["path"] for f in files}

        out = run(second, CHECK, session_id="analysis")
        assert text(out).startswith("((200, 3), 1, 20, 4, True, [")  # f sees the reassigned global
        assert "'data.csv'" in text(out) and "'up.txt'" in text(out)
        notes = " ".join(out["notes"])
        assert "resumed stored session 'analysis'" in notes
        assert "variables restored (saved when its interpreter stopped" in notes
        assert "df" in notes and "model" in notes and "np" in notes
        assert "gen" in notes and "not saved" in notes  # a generator cannot be saved: said so
        # Only the first call restores.
        assert not run(second, "1", session_id="analysis")["notes"]
    finally:
        second.kill()


def test_sigkill_keeps_files_and_restores_the_last_autosave_with_its_age(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = StdioServer.start(tmp_path / "a", "--autosave-seconds", "0.5", data_dir=data)
    try:
        run(first, "a = 1", session_id="crash")
        for _ in range(200):  # the autosave comes once the session is idle
            rows = first.call_tool("list_sessions", {})["structuredContent"]["sessions"]
            if rows[0]["variables_saved_at"]:
                break
            time.sleep(0.1)
        assert rows[0]["variables_saved_at"], rows
        run(first, "a = 2\nopen('after.txt', 'w').write('x')", session_id="crash")
        first.proc.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()

    second = StdioServer.start(tmp_path / "b", data_dir=data)
    try:
        out = run(second, "a, open('after.txt').read()", session_id="crash")
        assert text(out) == "(1, 'x')"  # files as they were; variables from the last snapshot
        notes = " ".join(out["notes"])
        assert "from a snapshot saved" in notes and "ago" in notes
        assert "stopped without saving" in notes
    finally:
        second.kill()


def test_two_servers_on_one_data_dir_do_not_share_a_live_session(tmp_path: Path) -> None:
    data = tmp_path / "data"
    one = StdioServer.start(tmp_path / "a", data_dir=data)
    two = StdioServer.start(tmp_path / "b", data_dir=data)
    try:
        run(one, "x = 'one'", session_id="shared")
        refused = two.request(
            "tools/call", {"name": "run_code", "arguments": {"code": "1", "session_id": "shared"}}
        )
        assert refused["isError"]
        msg = refused["content"][0]["text"]
        assert "in use by another kernmind server" in msg and f"pid {one.proc.pid}" in msg
        # The other server lists it as live elsewhere, and works with its own sessions.
        rows = two.call_tool("list_sessions", {})["structuredContent"]["sessions"]
        assert [(r["session_id"], r["state"], r["held_by_pid"]) for r in rows] == [
            ("shared", "in_other_server", one.proc.pid)
        ]
        assert text(run(two, "'two'", session_id="mine")) == "'two'"
        # The command line does not delete it from under its server either.
        cli = run_cli(["sessions", "rm", "shared", "--data-dir", str(data)], tmp_path)
        assert cli.returncode == 1 and "in use by another kernmind server" in cli.stderr
        # Once the first server lets go (it stops), the second resumes it, variables and all.
        one.proc.send_signal(signal.SIGTERM)
        assert one.wait(60) == 0
        assert text(run(two, "x", session_id="shared")) == "'one'"
    finally:
        one.kill()
        two.kill()


def test_sessions_command_line_lists_removes_and_prunes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = StdioServer.start(tmp_path / "a", data_dir=data)
    try:
        for sid in ("keep", "drop", "old"):
            server.call_tool("upload_file", {"path": "f.txt", "content": sid, "session_id": sid})
        server.call_tool("run_code", {"code": "1", "session_id": "keep"})
        server.close_stdin()
        assert server.wait(60) == 0
    finally:
        server.kill()
    listing = run_cli(["sessions", "list", "--data-dir", str(data)], tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "local/keep" in listing.stdout and "stored" in listing.stdout
    rows = json.loads(run_cli(["sessions", "list", "--json", "--data-dir", str(data)], tmp_path).stdout)
    assert {r["session_id"] for r in rows} == {"keep", "drop", "old"}
    assert all(r["files"] >= 1 and r["held_by_pid"] is None for r in rows)

    assert run_cli(["sessions", "rm", "drop", "--data-dir", str(data)], tmp_path).returncode == 0
    missing = run_cli(["sessions", "rm", "drop", "--data-dir", str(data)], tmp_path)
    assert missing.returncode == 1 and "no stored session 'drop'" in missing.stderr
    meta = data / "sessions" / "local" / "old" / "meta.json"
    stale = json.loads(meta.read_text())
    meta.write_text(json.dumps({**stale, "last_used": time.time() - 40 * 86400}))
    pruned = run_cli(["sessions", "prune", "--data-dir", str(data)], tmp_path)
    assert "deleted local/old" in pruned.stdout
    rows = json.loads(run_cli(["sessions", "list", "--json", "--data-dir", str(data)], tmp_path).stdout)
    assert [r["session_id"] for r in rows] == ["keep"]


# --- in-process servers (same server code, faster to start; the store's rules on fake kernels) ----
@pytest.mark.anyio
@pytest.mark.fast
async def test_stored_session_caps_refuse_new_sessions_naming_ones_to_close(tmp_path: Path) -> None:
    async with fake_client(fake_settings(tmp_path, pool_size=0, max_stored_sessions=2)) as (c, _):
        for sid in ("first", "second"):
            structured(await c.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": sid}))
        msg = error_text(
            await c.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": "third"})
        )
        assert "you have 2 stored sessions" in msg and "--max-stored-sessions 2" in msg, msg
        assert "close_session" in msg and "first" in msg
        structured(await c.call_tool("close_session", {"session_id": "first"}))
        structured(await c.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": "third"}))
        sessions = structured(await c.call_tool("list_sessions", {}))["sessions"]
        assert sorted(s["session_id"] for s in sessions) == ["second", "third"]


@pytest.mark.anyio
@pytest.mark.fast
async def test_close_session_deletes_a_stored_session(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, pool_size=0)
    async with fake_client(settings) as (c, _):
        structured(await c.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": "gone"}))
    async with fake_client(settings) as (c, _):  # stored, not live: close deletes it too
        closed = structured(await c.call_tool("close_session", {"session_id": "gone"}))
        assert "deleted" in closed["message"]
        assert "no session named 'gone'" in error_text(
            await c.call_tool("list_files", {"session_id": "gone"})
        )
    assert not (settings.sessions_dir / "local" / "gone").exists()


class Evil:
    """Unpickling this runs ``code`` (what a tampered snapshot could do)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code,))


@pytest.mark.anyio
@pytest.mark.skipif(not sandboxed(), reason="needs the bubblewrap sandbox")
async def test_a_tampered_snapshot_runs_only_inside_the_sandbox(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, pool_size=0)
    async with Client(create_server(settings)) as c:
        await c.call_tool("run_code", {"code": "kept = 41", "session_id": "t"})
    snap = settings.sessions_dir / "local" / "t" / "state" / "namespace.pkl"
    assert snap.exists()
    marker = tmp_path / "pwned"
    payload = (
        f"import os\nopen({str(marker)!r}, 'w').write('x')\n"  # a host path: not in the sandbox
        f"os.kill({__import__('os').getpid()}, 9)"  # the server's pid: not in the sandbox's pid namespace
    )
    evil = pickle.dumps(Evil(payload))
    record = len(b"boom").to_bytes(4, "little") + b"boom" + b"p" + len(evil).to_bytes(8, "little") + evil
    trailer = (0).to_bytes(4, "little") + b"m" + (2).to_bytes(8, "little") + b"{}"
    snap.write_bytes(b"KMSNAP2\n" + record + trailer)

    async with Client(create_server(settings)) as c:
        out = structured(await c.call_tool("run_code", {"code": "'kept' in globals()", "session_id": "t"}))
        notes = " ".join(out["notes"])
        assert "could not be restored: boom" in notes
        assert not marker.exists()
        # Garbage is reported, and the server keeps serving.
        snap.write_bytes(b"not a snapshot at all")
        structured(await c.call_tool("close_session", {"session_id": "t"}))
        assert structured(await c.call_tool("run_code", {"code": "1 + 1"}))["results"][0]["text"] == "2"
    async with Client(create_server(settings)) as c:
        await c.call_tool("run_code", {"code": "x = 1", "session_id": "g"})
    (settings.sessions_dir / "local" / "g" / "state" / "namespace.pkl").write_bytes(b"\x00garbage")
    async with Client(create_server(settings)) as c:
        out = structured(await c.call_tool("run_code", {"code": "'x' in globals()", "session_id": "g"}))
        assert out["results"][0]["text"] == "False"
        assert any("could not be read" in n for n in out["notes"])


@pytest.mark.anyio
async def test_files_written_while_a_kernel_runs_are_in_the_stored_home(tmp_path: Path) -> None:
    """The kernel writes straight into the session's home: nothing moves when it stops."""
    settings = make_settings(tmp_path, pool_size=1)
    async with Client(create_server(settings)) as c:
        structured(await c.call_tool("upload_file", {"path": "in.txt", "content": "a", "session_id": "h"}))
        for _ in range(200):  # a warm kernel: its directory is moved into place (rebind)
            if structured(await c.call_tool("list_sessions", {}))["warm_kernels"]:
                break
            await anyio.sleep(0.1)
        out = structured(
            await c.call_tool(
                "run_code",
                {"code": "open('out.txt', 'w').write(open('in.txt').read() * 2)", "session_id": "h"},
            )
        )
        assert out["status"] == "ok"
        home = settings.sessions_dir / "local" / "h" / "files"
        assert (home / "out.txt").read_text() == "aa"
        reset = structured(
            await c.call_tool(
                "run_code", {"code": "open('out.txt').read()", "session_id": "h", "reset": True}
            )
        )
        assert reset["results"][0]["text"] == "'aa'"
        assert not (home.parent / ".attach").exists()


def snapshot_of(*records: tuple[str, bytes]) -> bytes:
    """A snapshot file in the kernel's format (see snapshot.py): records, then the module trailer."""
    body = b"".join(
        len(name.encode()).to_bytes(4, "little")
        + name.encode()
        + b"p"
        + len(data).to_bytes(8, "little")
        + data
        for name, data in records
    )
    trailer = (0).to_bytes(4, "little") + b"m" + (2).to_bytes(8, "little") + b"{}"
    return b"KMSNAP2\n" + body + trailer


FORGED_REPORTS = [
    '{"restored": 5, "failed": {}}',  # not a list
    '{"restored": ["a"], "failed": ["b"]}',  # not a map
    "[1, 2, 3]",  # not a report
]


@pytest.mark.anyio
async def test_a_forged_restore_report_is_a_note_not_a_tool_error(tmp_path: Path) -> None:
    """Code that a snapshot runs while it loads can print whatever the server reads as the
    restore's report (here: it replaces ``print``); the call says the restore failed and runs.
    One stored session per forged report, planted on disk, all resumed by one server."""
    settings = make_settings(tmp_path, pool_size=0)
    for i, report in enumerate(FORGED_REPORTS):
        forge = f"import builtins, sys\nbuiltins.print = lambda *a, **k: sys.stdout.write('\\n' + {report!r} + '\\n')"
        home = settings.sessions_dir / "local" / f"f{i}"
        (home / "files").mkdir(parents=True)
        (home / "state").mkdir()
        (home / "state" / "namespace.pkl").write_bytes(snapshot_of(("forger", pickle.dumps(Evil(forge)))))
    async with Client(create_server(settings)) as c:
        for i, report in enumerate(FORGED_REPORTS):
            out = structured(await c.call_tool("run_code", {"code": "6 * 7", "session_id": f"f{i}"}))
            assert out["status"] == "ok" and out["results"][0]["text"] == "42", (report, out)
            notes = " ".join(out["notes"])
            assert "could not be restored" in notes and "reported nonsense" in notes, (report, notes)
        assert structured(await c.call_tool("run_code", {"code": "1 + 1"}))["results"][0]["text"] == "2"


def test_a_server_killed_during_the_first_save_says_so_on_resume(tmp_path: Path) -> None:
    """The first save of a session's variables is under way (a variable takes long to pickle)
    when the server is killed: there is no snapshot at all, and the resumed session says why."""
    data = tmp_path / "data"
    meta = data / "sessions" / "local" / "first" / "meta.json"
    first = StdioServer.start(tmp_path / "a", "--autosave-seconds", "0.5", data_dir=data)
    try:
        run(
            first,
            "class Slow:\n    def __reduce__(self):\n        __import__('time').sleep(60)\n        return (int, ())\n"
            "kept = 1\nslow = Slow()",
            session_id="first",
        )
        for _ in range(300):  # the autosave starts once the session is idle
            if meta.exists() and json.loads(meta.read_text()).get("save_started"):
                break
            time.sleep(0.1)
        assert json.loads(meta.read_text())["save_started"], meta.read_text()
        first.proc.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()

    second = StdioServer.start(tmp_path / "b", data_dir=data)
    try:
        out = run(second, "'kept' in globals()", session_id="first")
        assert text(out) == "False"
        notes = " ".join(out["notes"])
        assert "saving this session's variables began" in notes and "never finished" in notes, notes
        assert "could not be restored" in notes and "fresh interpreter" in notes
    finally:
        second.kill()

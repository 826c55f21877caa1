"""stdio: the SDK's own client launches ``kernmind serve`` the way desktop clients do.

Both protocol eras (``mode="legacy"`` = 2025-11-25 handshake, ``"auto"`` = 2026-07-28
discovery) list the tools, keep a named session's state across calls, and end the server
cleanly by closing its stdin (what ``mcp.Client`` does on exit).
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.transport.procs import mentioning, serve_argv, server_env

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "version"), [("legacy", "2025-11-25"), ("auto", "2026-07-28")])
async def test_stdio_client_both_eras(tmp_path: Path, mode: str, version: str) -> None:
    argv = serve_argv(tmp_path / "data")
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=server_env(tmp_path))
    assert params.command == sys.executable
    t0 = time.monotonic()
    with anyio.fail_after(90):
        async with Client(params, mode=mode) as client:
            assert client.protocol_version == version
            tools = await client.list_tools()
            first_list = time.monotonic() - t0
            names = {t.name for t in tools.tools}
            assert {
                "run_code",
                "list_sessions",
                "close_session",
                "upload_file",
                "download_file",
                "list_files",
            } <= names
            assert {
                "memory_list",
                "memory_create",
                "archival_memory_insert",
                "archival_memory_search",
            } <= names

            await client.call_tool("run_code", {"code": "counter = 1", "session_id": "s"})
            again = await client.call_tool("run_code", {"code": "counter += 1; counter", "session_id": "s"})
            assert again.structured_content is not None
            assert again.structured_content["results"][0]["text"] == "2"
            assert again.structured_content["session_id"] == "s"

            up = await client.call_tool(
                "upload_file", {"path": "in.txt", "content": "abc", "session_id": "s"}
            )
            assert not up.is_error, up
            read = await client.call_tool("run_code", {"code": "open('in.txt').read()", "session_id": "s"})
            assert read.structured_content["results"][0]["text"] == "'abc'"  # type: ignore[index]
    # Closing stdin ends the server; the client waited for it, so nothing of it may remain.
    assert not mentioning(str(tmp_path / "data"))
    assert first_list < 60, f"first tools/list took {first_list:.1f}s"


def test_serve_on_a_terminal_says_what_it_is_waiting_for(tmp_path: Path) -> None:
    """A person who types ``kernmind serve`` gets one line on stderr instead of silence."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        serve_argv(tmp_path / "data"),
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(tmp_path),
    )
    os.close(follower)
    try:
        assert proc.stderr is not None
        # log lines may come first (a clean-up of control groups that killed servers left behind)
        lines = [proc.stderr.readline().decode() for _ in range(1)]
        while "speaking MCP on stdio" not in lines[-1] and len(lines) < 20 and lines[-1]:
            lines.append(proc.stderr.readline().decode())
        line = lines[-1]
        assert (
            "speaking MCP on stdio" in line and "inspector@2.12.0" in line and "--transport http" in line
        ), lines
        assert all(" INFO " in earlier or " WARNING " in earlier for earlier in lines[:-1]), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stdout is not None and proc.stdout.read() == b""  # nothing on the MCP channel
    finally:
        os.close(leader)
        proc.kill()


def test_serve_from_a_client_prints_no_hint(tmp_path: Path) -> None:
    proc = subprocess.run(
        serve_argv(tmp_path / "data"), stdin=subprocess.DEVNULL, capture_output=True, env=server_env(tmp_path)
    )
    assert proc.returncode == 0
    assert b"speaking MCP on stdio" not in proc.stderr

"""Each client its own default session: two desktop clients on one data directory.

Two real ``kernmind serve`` processes over stdio share a data directory (two desktop apps
launching kernmind with the same configuration). Calls without ``session_id`` go to a default
session named after the client's ``clientInfo.name``, so both work at once and neither sees
the other's variables, and a third client's first call restores nobody's. A ``session_id``
the caller names (``default`` included) is that session, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.transport.procs import StdioServer

pytestmark = [pytest.mark.xdist_group("transport")]


def _run(server: StdioServer, code: str, **args: str) -> dict:
    return server.call_tool("run_code", {"code": code, **args})["structuredContent"]


def test_two_clients_on_one_data_dir_each_get_their_own_default(tmp_path: Path) -> None:
    data = tmp_path / "data"
    claude = StdioServer.start(tmp_path / "a", data_dir=data, client_name="Claude Desktop")
    cursor = StdioServer.start(tmp_path / "b", data_dir=data, client_name="cursor-vscode")
    try:
        first = _run(claude, "owner = 'claude'")
        second = _run(cursor, "owner = 'cursor'")  # was refused: 'default' in use by another server
        assert first["status"] == second["status"] == "ok", (first, second)
        assert first["session_id"] == "default-claude-desktop"
        assert second["session_id"] == "default-cursor-vscode"
        assert _run(claude, "owner")["results"][0]["text"] == "'claude'"
        assert _run(cursor, "owner")["results"][0]["text"] == "'cursor'"
        # A session the caller names is that session, ``default`` included.
        assert _run(claude, "shared = 1", session_id="default")["session_id"] == "default"
        assert _run(cursor, "2", session_id="elsewhere")["session_id"] == "elsewhere"
    finally:
        claude.close_stdin()
        cursor.close_stdin()
        assert claude.wait() == 0 and cursor.wait() == 0
    zed = StdioServer.start(tmp_path / "c", data_dir=data, client_name="Zed")
    try:
        fresh = _run(zed, "'owner' in dir()")
        assert fresh["session_id"] == "default-zed"
        assert fresh["results"][0]["text"] == "False"  # no other client's variables restored
        assert not any("resumed" in note for note in fresh.get("notes", []))
    finally:
        zed.close_stdin()
        zed.wait()

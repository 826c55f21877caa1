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

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]


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


def test_the_same_app_launched_twice_gets_a_default_of_its_own(tmp_path: Path) -> None:
    """Two windows of one app (one client name, one data dir): the second server's calls without
    ``session_id`` were refused ('in use by another kernmind server') until the first stopped."""
    data = tmp_path / "data"
    first = StdioServer.start(tmp_path / "a", data_dir=data, client_name="Claude Code")
    second = StdioServer.start(tmp_path / "b", data_dir=data, client_name="Claude Code")
    try:
        one = _run(first, "window = 1")
        two = _run(second, "window = 2")
        assert one["status"] == two["status"] == "ok", (one, two)
        assert one["session_id"] == "default-claude-code"
        assert two["session_id"] == "default-claude-code-2"
        assert any("default-claude-code-2" in n and "in use by another" in n for n in two["notes"]), two
        assert not any("in use" in n for n in one.get("notes", []))
        assert _run(first, "window")["results"][0]["text"] == "1"
        again = _run(second, "window")
        assert again["results"][0]["text"] == "2" and again["session_id"] == "default-claude-code-2"
        assert not any("in use" in n for n in again.get("notes", []))  # said once
    finally:
        first.close_stdin()
        second.close_stdin()
        assert first.wait() == 0 and second.wait() == 0


def test_client_names_without_ascii_letters_get_their_own_default() -> None:
    from kernmind.execution.sessions.client_defaults import default_session_for

    accents, greek = default_session_for("é" * 500), default_session_for("αβγ")
    assert accents.startswith("default-u-") and greek.startswith("default-u-")
    assert accents != greek != "default"
    assert default_session_for("é" * 500) == accents  # stable across launches
    assert default_session_for("!!!") == "default" and default_session_for(None) == "default"

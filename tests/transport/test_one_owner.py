"""One memory per person across transports: the stdio user and the server's own token are one principal.

Before round 4, on one data dir, stdio wrote memory to the namespace ``default`` and an HTTP
client with the server's own ``--token`` to ``default/default``: notes written over HTTP were
not found over stdio. Real servers here: an HTTP server with ``--token`` and a stdio server on
the same data dir, and a principal added with ``kernmind tokens add``, which stays separate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.transport.procs import StdioServer, start_http

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]


def _add_principal(data: Path, name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "tokens", "add", name, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1].split()[-1]


@pytest.mark.anyio
async def test_stdio_and_the_servers_own_token_share_notes_and_sessions(tmp_path: Path) -> None:
    (tmp_path / "h").mkdir()
    http = start_http(tmp_path / "h", token="owner-secret-token")
    stdio = StdioServer.start(tmp_path / "s", data_dir=http.data_dir)
    alice = _add_principal(http.data_dir, "alice")
    try:

        async def over_http(name: str, args: dict[str, Any], token: str | None = "") -> dict[str, Any]:
            async with http.client("legacy", token=token) as client:
                result = await client.call_tool(name, args)
                assert not result.is_error, result
                return result.structured_content or {}

        with anyio.fail_after(180):
            await over_http("archival_memory_insert", {"content": "The owner keeps bees on the roof"})
            await over_http("memory_append", {"label": "human", "content": "Prefers green tea"})
            await over_http("run_code", {"code": "via_http = 7", "session_id": "from-http"})

            found = stdio.call_tool("archival_memory_search", {"query": "bees on the roof"})
            rows = found["structuredContent"]["results"]
            assert any("bees" in row["content"] for row in rows), rows
            human = stdio.call_tool("memory_read", {"label": "human"})
            assert "green tea" in str(human["structuredContent"]), human
            listed = stdio.call_tool("list_sessions", {})["structuredContent"]["sessions"]
            mine = {(s["session_id"], s.get("owner", "local")) for s in listed}
            assert ("from-http", "local") in mine, listed  # the same owner, not 'default'

            # Written over stdio, read over HTTP with the server's own token.
            stdio.call_tool("archival_memory_insert", {"content": "The owner's bike is blue"})
            back = await over_http("archival_memory_search", {"query": "bike blue"})
            assert any("bike" in row["content"] for row in back["results"]), back

            # A principal added with `tokens add` keeps a memory of its own.
            theirs = await over_http("archival_memory_search", {"query": "bees on the roof"}, token=alice)
            assert not any("bees" in row["content"] for row in theirs["results"]), theirs
    finally:
        stdio.close_stdin()
        assert stdio.wait() == 0
        http.stop()

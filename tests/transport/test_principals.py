"""Principals over real HTTP: each token names a principal that owns its sessions.

One `kernmind serve --transport http --tokens FILE` process; alice and bob are ordinary
principals, root is an admin. Every boundary is checked over the wire: another principal's
session is not listed, not reachable and not closable, and the refusal says "no session
named X" (never "forbidden"); an admin sees and manages everything; revoking a token with
`kernmind tokens revoke` locks its holder out at once, without a restart.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("principals"), pytest.mark.slow]


class Deployment:
    def __init__(self, server: HttpServer, tokens: dict[str, str], tokens_file: Path) -> None:
        self.server = server
        self.tokens = tokens
        self.tokens_file = tokens_file

    def client(self, who: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("principals")
    tokens_file = tmp / "tokens.json"
    file = TokenFile(tokens_file)
    tokens = {
        name: file.add(name, roles) for name, roles in (("alice", []), ("bob", []), ("root", ["admin"]))
    }
    server = start_http(tmp, "--tokens", str(tokens_file), "--sandbox", "none")
    try:
        yield Deployment(server, tokens, tokens_file)
    finally:
        server.stop()


@pytest.fixture
async def alice(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("alice") as c:
        yield c


@pytest.fixture
async def bob(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("bob") as c:
        yield c


@pytest.fixture
async def root(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("root") as c:
        yield c


async def run(client: Client, code: str, session: str, language: str = "python") -> dict[str, Any]:
    return structured(
        await client.call_tool("run_code", {"code": code, "session_id": session, "language": language})
    )


def session_ids(listing: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["owner"], s["session_id"]) for s in listing["sessions"]}


async def test_a_principals_sessions_are_invisible_to_another(alice: Client, bob: Client) -> None:
    await run(alice, "secret = 'alice only'\nopen('private.txt', 'w').write(secret)", "notes")
    assert ("alice", "notes") in session_ids(structured(await alice.call_tool("list_sessions", {})))
    assert not any(
        owner == "alice" for owner, _ in session_ids(structured(await bob.call_tool("list_sessions", {})))
    )
    # bob's "notes" is a different session: alice's variable is not there
    out = await run(bob, "'secret' in globals()", "notes")
    assert out["results"][0]["text"] == "False"
    msg = error_text(await bob.call_tool("download_file", {"path": "private.txt", "session_id": "notes"}))
    assert "private.txt" in msg and "forbidden" not in msg.lower()


async def test_another_principals_session_cannot_be_reached_or_closed(alice: Client, bob: Client) -> None:
    await run(alice, "x = 1", "alice-only")
    for tool, args in (
        ("close_session", {"session_id": "alice-only"}),
        ("list_files", {"session_id": "alice-only"}),
        ("download_file", {"session_id": "alice-only", "path": "x"}),
    ):
        msg = error_text(await bob.call_tool(tool, args))
        assert "no session named 'alice-only'" in msg.lower(), msg
        assert "forbidden" not in msg.lower()
    # a non-admin cannot address another owner's session by name either
    msg = error_text(await bob.call_tool("run_code", {"code": "1", "session_id": "alice/alice-only"}))
    assert "session_id" in msg
    assert (await run(alice, "x", "alice-only"))["results"][0]["text"] == "1"


async def test_an_admin_sees_and_manages_every_session(alice: Client, root: Client) -> None:
    await run(alice, "open('report.txt', 'w').write('for the admin')", "managed")
    listing = structured(await root.call_tool("list_sessions", {}))
    assert ("alice", "managed") in session_ids(listing)
    got = structured(
        await root.call_tool("download_file", {"path": "report.txt", "session_id": "alice/managed"})
    )
    assert got["content"] == "for the admin"
    structured(await root.call_tool("close_session", {"session_id": "alice/managed"}))
    assert ("alice", "managed") not in session_ids(structured(await alice.call_tool("list_sessions", {})))


async def test_a_revoked_token_stops_working_without_a_restart(
    deployment: Deployment, tmp_path: Path
) -> None:
    file = TokenFile(deployment.tokens_file)
    token = file.add("carol", [])
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2026-07-28"}

    def status() -> int:
        return httpx2.post(deployment.server.url, json=body, headers=headers, timeout=30).status_code

    assert status() != 401
    revoked = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernmind",
            "tokens",
            "revoke",
            "carol",
            "--tokens",
            str(deployment.tokens_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert revoked.returncode == 0, revoked.stderr
    assert status() == 401


def test_tokens_add_prints_the_token_once_and_stores_only_its_digest(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "tokens", "add", "dave", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1].split()[-1]
    stored = (tmp_path / "tokens.json").read_text()
    assert token not in stored
    assert json.loads(stored)["tokens"][0]["name"] == "dave"
    assert (tmp_path / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert TokenFile(tmp_path / "tokens.json").principal_for(token).name == "dave"  # type: ignore[union-attr]


def test_a_malformed_tokens_file_refuses_to_start(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.json"
    bad.write_text('{"tokens": [{"name": "eve"}]}')
    with pytest.raises(RuntimeError, match="sha256"):
        start_http(tmp_path, "--tokens", str(bad))


async def test_each_principal_has_its_own_memory(alice: Client, bob: Client) -> None:
    """Blocks and archival passages written by one principal are not another's."""
    structured(await alice.call_tool("memory_rethink", {"label": "human", "new_memory": "Alice's notes."}))
    structured(await alice.call_tool("archival_memory_insert", {"content": "alice keeps the launch codes"}))
    bobs = structured(await bob.call_tool("memory_read", {"label": "human"}))
    assert "Alice" not in bobs["value"]
    found = structured(await bob.call_tool("archival_memory_search", {"query": "launch codes"}))
    assert not any("alice" in r["content"] for r in found["results"])
    assert structured(await alice.call_tool("memory_read", {"label": "human"}))["value"] == "Alice's notes."


async def test_a_code_call_opens_no_memory_and_the_first_memory_call_does(deployment: Deployment) -> None:
    """A principal's namespace is made on its first memory request, not on its first request."""
    token = TokenFile(deployment.tokens_file).add("dave", [])
    db = deployment.server.data_dir / "kernmind.db"

    def namespaces_of_dave() -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return [row for row in conn.execute("SELECT * FROM namespaces") if "dave" in repr(row)]

    async with http_client(deployment.server.url, {"Authorization": f"Bearer {token}"}, "auto") as dave:
        assert (await run(dave, "6 * 7", "d"))["results"][0]["text"] == "42"
        assert namespaces_of_dave() == []
        structured(await dave.call_tool("memory_read", {"label": "human"}))
        assert len(namespaces_of_dave()) == 1

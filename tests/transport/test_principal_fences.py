"""What keeps one principal's things from another over real HTTP: revoked names, transport
sessions and browser origins.

One `kernmind serve --transport http --tokens FILE --allowed-origin https://app.example.com`
process; alice and bob (and, for adoption, carol) are ordinary principals; `kernmind tokens`
runs as a separate process against the same tokens file and data dir, as an admin would.

- A revoked name added again starts empty (sessions, variables, files, memory, jobs), and
  `tokens list` shows the revoked name with the data it left; `tokens add NAME --adopt`
  gives that data back.
- A transport session (`Mcp-Session-Id`) belongs to the principal that opened it: another
  principal's DELETE or POST with it gets the same 404 as an unknown id, and ids never
  reach the log.
- Browser origins other than the server's own (and `--allowed-origin`) are refused with a
  sentence; requests without an Origin header are not affected.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, server_env, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("principal-fences"), pytest.mark.slow]

ALLOWED = "https://app.example.com"
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class Deployment:
    def __init__(self, server: HttpServer, tokens_file: Path, tmp: Path) -> None:
        self.server = server
        self.tokens_file = tokens_file
        self.tmp = tmp
        self.tokens: dict[str, str] = {}

    def client(self, token: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {token}"}, "auto")

    def cli(self, *args: str) -> str:
        """``kernmind tokens …`` on this deployment's file and data dir; its stdout."""
        argv = [sys.executable, "-m", "kernmind", "tokens", *args, "--tokens", str(self.tokens_file)]
        argv += ["--data-dir", str(self.server.data_dir)]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=server_env(self.tmp), check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def add(self, name: str, *extra: str) -> str:
        token = self.cli("add", name, *extra).strip().splitlines()[-1].split()[-1]
        self.tokens[name] = token
        return token


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("fences")
    tokens_file = tmp / "tokens.json"
    file = TokenFile(tokens_file)
    tokens = {name: file.add(name, []) for name in ("alice", "bob", "carol")}
    server = start_http(
        tmp,
        *("--tokens", str(tokens_file), "--sandbox", "none", "--allowed-origin", ALLOWED),
        *("--autosave-seconds", "1"),  # variables saved a second after a call: what adoption takes
    )
    d = Deployment(server, tokens_file, tmp)
    d.tokens.update(tokens)
    try:
        yield d
    finally:
        server.stop()


async def run(client: Client, code: str, session: str) -> dict[str, Any]:
    return structured(await client.call_tool("run_code", {"code": code, "session_id": session}))


async def leave_traces(client: Client, who: str) -> str:
    """Sessions, variables, files, memory and a finished job of ``who``; returns the job id."""
    await run(client, f"x = 42\nopen('kept.txt', 'w').write('{who} was here')", "work")
    structured(await client.call_tool("memory_rethink", {"label": "human", "new_memory": f"{who}'s notes"}))
    structured(await client.call_tool("archival_memory_insert", {"content": f"{who} keeps the ledger"}))
    job = structured(
        await client.call_tool("run_code", {"code": "21 * 2", "session_id": "jobs", "background": True})
    )["job_id"]
    with anyio.fail_after(60):
        while structured(await client.call_tool("job_status", {"job_id": job}))["state"] == "running":  # noqa: ASYNC110 - the server runs it
            await anyio.sleep(0.2)
    return job


# --- revocation ---------------------------------------------------------------------------------
async def test_a_revoked_name_added_again_starts_empty(deployment: Deployment) -> None:
    async with deployment.client(deployment.tokens["bob"]) as old_bob:
        job = await leave_traces(old_bob, "old bob")
    out = deployment.cli("revoke", "bob")
    assert "data stays under 'bob'" in out
    new_token = deployment.add("bob")
    async with deployment.client(new_token) as bob:
        listing = structured(await bob.call_tool("list_sessions", {}))
        assert not any(s["session_id"] in ("work", "jobs") for s in listing["sessions"]), listing
        assert (await run(bob, "'x' in globals()", "work"))["results"][0]["text"] == "False"
        msg = error_text(await bob.call_tool("download_file", {"path": "kept.txt", "session_id": "work"}))
        assert "kept.txt" in msg
        assert "old bob" not in structured(await bob.call_tool("memory_read", {"label": "human"}))["value"]
        found = structured(await bob.call_tool("archival_memory_search", {"query": "ledger"}))
        assert not any("old bob" in r["content"] for r in found["results"]), found
        assert "no job" in error_text(await bob.call_tool("job_status", {"job_id": job}))
    listed = deployment.cli("list")
    revoked = [line for line in listed.splitlines() if line.startswith("bob") and "revoked" in line]
    assert len(revoked) == 1, listed
    assert "data kept:" in revoked[0] and "session" in revoked[0] and "memory block" in revoked[0], listed
    live = [line for line in listed.splitlines() if line.startswith("bob") and " live " in line]
    assert len(live) == 1 and "data=bob~2" in live[0], listed
    # the other principals are untouched
    async with deployment.client(deployment.tokens["alice"]) as alice:
        assert "alice" not in str(structured(await alice.call_tool("memory_read", {"label": "human"})))


async def test_adopt_gives_a_revoked_names_data_to_the_new_token(deployment: Deployment) -> None:
    async with deployment.client(deployment.tokens["carol"]) as old_carol:
        job = await leave_traces(old_carol, "carol")
        # Revocation ends a session without saving it (saving would run the revoked principal's
        # pickling code): what a new token adopts is what was saved before, here by the autosave.
        with anyio.fail_after(60):
            while not any(  # noqa: ASYNC110 - the server's autosave writes it
                s["session_id"] == "work" and s.get("variables_saved_at")
                for s in structured(await old_carol.call_tool("list_sessions", {}))["sessions"]
            ):
                await anyio.sleep(0.2)
    deployment.cli("revoke", "carol")
    out = deployment.cli("add", "carol", "--adopt")
    assert "adopts the data kept under 'carol'" in out, out
    new_token = out.strip().splitlines()[-1].split()[-1]
    async with deployment.client(new_token) as carol:
        assert (await run(carol, "x", "work"))["results"][0]["text"] == "42"
        got = structured(await carol.call_tool("download_file", {"path": "kept.txt", "session_id": "work"}))
        assert got["content"] == "carol was here"
        assert (
            structured(await carol.call_tool("memory_read", {"label": "human"}))["value"] == "carol's notes"
        )
        found = structured(await carol.call_tool("archival_memory_search", {"query": "ledger"}))
        assert any("carol keeps the ledger" in r["content"] for r in found["results"]), found
        assert structured(await carol.call_tool("job_status", {"job_id": job}))["state"] == "done"
    listed = deployment.cli("list")
    assert not any(line.startswith("carol") and "revoked" in line for line in listed.splitlines()), listed


# --- transport sessions -------------------------------------------------------------------------
async def open_transport_session(http: httpx2.AsyncClient, url: str, token: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    r = await http.post(url, json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    r = await http.post(url, json=note, headers=session_headers(token, sid))
    assert r.status_code in (200, 202), r.text
    return sid


def session_headers(token: str, sid: str) -> dict[str, str]:
    return {
        **ACCEPT,
        "Authorization": f"Bearer {token}",
        "Mcp-Session-Id": sid,
        "MCP-Protocol-Version": LEGACY,
    }


async def test_another_principals_transport_session_is_unknown(deployment: Deployment) -> None:
    url, alice, bob = deployment.server.url, deployment.tokens["alice"], deployment.tokens["bob"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient(timeout=60) as http:
        sid = await open_transport_session(http, url, alice)
        unknown = await http.request("DELETE", url, headers=session_headers(bob, "0" * 32))
        assert unknown.status_code == 404
        stolen_delete = await http.request("DELETE", url, headers=session_headers(bob, sid))
        stolen_post = await http.post(url, json=listing, headers=session_headers(bob, sid))
        for answer in (stolen_delete, stolen_post):
            assert (answer.status_code, answer.text) == (unknown.status_code, unknown.text)
        # alice's session survived bob's attempts
        mine = await http.post(url, json=listing, headers=session_headers(alice, sid))
        assert mine.status_code == 200 and "run_code" in mine.text
        ended = await http.request("DELETE", url, headers=session_headers(alice, sid))
        assert ended.status_code in (200, 204)
        gone = await http.post(url, json=listing, headers=session_headers(alice, sid))
        assert gone.status_code == 404
    log = deployment.server.log_text()
    assert sid not in log and sid[:16] not in log, "a transport session id reached the log"
    assert re.search(r"session#[0-9a-f]{6}", log), "transport events are logged by tag"


# --- origins ---------------------------------------------------------------------------------------
async def test_foreign_browser_origins_are_refused(deployment: Deployment) -> None:
    url = deployment.server.url
    port = url.split(":")[2].split("/")[0]
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
    headers = {
        **ACCEPT,
        "Authorization": f"Bearer {deployment.tokens['alice']}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/list",
    }
    async with httpx2.AsyncClient(timeout=60) as http:

        async def status(origin: str | None) -> httpx2.Response:
            extra = {"Origin": origin} if origin is not None else {}
            return await http.post(url, json=body, headers={**headers, **extra})

        for foreign in (
            "http://localhost:3000",
            f"http://localhost:{int(port) + 1}",
            "http://evil.example",
            "null",
            f"https://127.0.0.1:{port}",
        ):
            refused = await status(foreign)
            assert refused.status_code == 403, (foreign, refused.status_code, refused.text)
            assert "--allowed-origin" in refused.json()["error"]["message"]
        for accepted in (None, f"http://127.0.0.1:{port}", f"http://localhost:{port}", ALLOWED):
            answer = await status(accepted)
            assert answer.status_code == 200, (accepted, answer.status_code, answer.text)

"""Streamable HTTP: bearer-token auth, the loopback guard, both protocol eras, several clients.

One real ``kernmind serve --transport http --token …`` process serves the whole module;
clients are the SDK's ``mcp.Client`` over ``streamable_http_client`` (legacy = the
2025-11-25 handshake, auto = the 2026-07-28 sessionless era) and raw ``httpx2`` requests.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from kernmind.transport.auth import BearerTokenMiddleware
from kernmind.transport.http import bind_socket, is_loopback
from tests.transport.procs import HttpServer, mentioning, run_cli, start_http

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

TOKEN = "test-token-0123456789"
MODERN = "2026-07-28"
LEGACY = "2025-11-25"


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = start_http(tmp_path_factory.mktemp("http"), token=TOKEN)
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, server.log_text()


def _init_body(version: str = LEGACY) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }


ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# --- pure functions -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_middleware_accepts_only_the_exact_bearer_token() -> None:
    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
        pass

    mw = BearerTokenMiddleware(app, TOKEN)  # type: ignore[arg-type]
    ok = [(b"authorization", f"Bearer {TOKEN}".encode())]
    assert mw.authorized(ok)
    assert mw.authorized([(b"Authorization", f"bearer {TOKEN}".encode())])  # scheme is case-insensitive
    for bad in [
        [],
        [(b"authorization", b"")],
        [(b"authorization", b"Bearer")],
        [(b"authorization", f"Basic {TOKEN}".encode())],
        [(b"authorization", f"Bearer {TOKEN}x".encode())],
        [(b"authorization", f"Bearer {TOKEN[:-1]}".encode())],
        [(b"authorization", TOKEN.encode())],
        [(b"x-token", TOKEN.encode())],
    ]:
        assert not mw.authorized(bad), bad
    with pytest.raises(ValueError):
        BearerTokenMiddleware(app, "")  # type: ignore[arg-type]


# --- start-up refusals ------------------------------------------------------------------------
def test_non_loopback_host_without_token_is_refused(tmp_path: Path) -> None:
    host = "0.0.0.0"
    data = tmp_path / "data"
    proc = run_cli(
        ["serve", "--transport", "http", "--host", host, "--port", "0", "--data-dir", str(data)], tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert "refusing to listen" in proc.stderr and "--token" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not data.exists()  # refused before anything was created or started
    assert not mentioning(str(data))


@pytest.mark.anyio
async def test_non_loopback_host_with_env_token_starts(tmp_path: Path) -> None:
    """KERNMIND_TOKEN is as good as --token: 0.0.0.0 is accepted and the token enforced."""
    server = start_http(tmp_path, "--host", "0.0.0.0", env={"KERNMIND_TOKEN": "from-env"})
    try:
        assert "(bearer token required)" in server.log_text()
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        url = f"http://127.0.0.1:{port}/mcp"
        async with httpx2.AsyncClient() as http:
            denied = await http.post(url, json=_init_body(), headers=ACCEPT)
            allowed = await http.post(
                url, json=_init_body(), headers={**ACCEPT, "Authorization": "Bearer from-env"}
            )
        assert denied.status_code == 401
        assert allowed.status_code == 200, allowed.text
    finally:
        assert server.stop() == 0, server.log_text()


def test_busy_port_fails_cleanly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli(
            ["serve", "--transport", "http", "--port", str(port), "--data-dir", str(tmp_path / "d")], tmp_path
        )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the token on the wire --------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize(
    "auth",
    [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}-extra", TOKEN],
    ids=["none", "empty", "no-token", "wrong", "basic", "suffix", "no-scheme"],
)
async def test_requests_without_the_token_get_401(http_server: HttpServer, auth: str | None) -> None:
    headers = dict(ACCEPT)
    if auth is not None:
        headers["Authorization"] = auth
    async with httpx2.AsyncClient() as http:
        for method, extra in [
            ("POST", {}),
            ("POST", {"MCP-Protocol-Version": MODERN}),
            ("GET", {}),
            ("DELETE", {"Mcp-Session-Id": "x"}),
        ]:
            body = (
                _init_body(MODERN if extra.get("MCP-Protocol-Version") else LEGACY)
                if method == "POST"
                else None
            )
            r = await http.request(method, http_server.url, json=body, headers={**headers, **extra})
            assert r.status_code == 401, (method, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"] == "unauthorized"
        other = await http.get(http_server.url.replace("/mcp", "/anything"), headers=headers)
        assert other.status_code == 401


@pytest.mark.anyio
async def test_wrong_token_client_cannot_connect(http_server: HttpServer) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the SDK wraps the 401 in its own error types
        with anyio.fail_after(30):
            async with http_server.client("legacy", token="nope") as client:
                await client.list_tools()


@pytest.mark.anyio
async def test_dns_rebinding_host_is_rejected_even_with_token(http_server: HttpServer) -> None:
    async with httpx2.AsyncClient() as http:
        r = await http.post(
            http_server.url,
            json=_init_body(),
            headers={**ACCEPT, **http_server.headers(), "Host": "evil.example:80"},
        )
    assert r.status_code in (400, 403, 421), r.text


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "version"), [("legacy", LEGACY), ("auto", MODERN), (MODERN, MODERN)])
async def test_both_protocol_eras_with_token(http_server: HttpServer, mode: str, version: str) -> None:
    with anyio.fail_after(60):
        async with http_server.client(mode) as client:
            assert client.protocol_version == version
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"run_code", "list_sessions", "close_session", "upload_file", "download_file"} <= names
            assert {"memory_create", "memory_read", "archival_memory_insert"} <= names
            result = await client.call_tool("run_code", {"code": "6 * 7", "session_id": f"era-{mode}"})
            assert not result.is_error, result
            assert result.structured_content is not None
            assert result.structured_content["results"][0]["text"] == "42"


# --- several clients, explicitly named sessions ----------------------------------------------
@pytest.mark.anyio
async def test_clients_of_both_eras_share_named_sessions(http_server: HttpServer) -> None:
    async def run(client: object, code: str, session_id: str | None = None) -> dict[str, object]:
        args: dict[str, object] = {"code": code}
        if session_id:
            args["session_id"] = session_id
        result = await client.call_tool("run_code", args)  # type: ignore[attr-defined]
        assert not result.is_error, result
        return result.structured_content

    with anyio.fail_after(90):
        async with http_server.client("legacy") as legacy, http_server.client("auto") as modern:
            assert modern.protocol_version == MODERN
            await run(legacy, "shared_value = 41", "shared")
            out = await run(modern, "shared_value += 1; shared_value", "shared")
            assert out["results"][0]["text"] == "42"  # type: ignore[index]
            # The default session (no session_id) is per client name: both are "mcp" here.
            await run(modern, "in_default = 'set by the sessionless client'")
            out = await run(legacy, "in_default")
            assert out["session_id"] == "default-mcp"  # both clients call themselves "mcp"
            assert "sessionless" in out["results"][0]["text"]  # type: ignore[index]

        # Reconnecting (a new handshake, a new Mcp-Session-Id) reaches the same kernel session.
        async with http_server.client("legacy") as again:
            out = await run(again, "shared_value", "shared")
            assert out["results"][0]["text"] == "42"  # type: ignore[index]
            sessions = await again.call_tool("list_sessions", {})
            ids = {s["session_id"] for s in sessions.structured_content["sessions"]}  # type: ignore[index]
            assert {"shared", "default-mcp"} <= ids


@pytest.mark.anyio
async def test_several_clients_run_at_the_same_time(http_server: HttpServer) -> None:
    """Three clients' calls all run at once: each waits inside its code for a file the test writes
    only once all three have started (calls run one after the other would never all start)."""
    modes = ["legacy", "auto", "legacy"]
    code = "import os, time\nopen('started', 'w').close()\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\n"
    with anyio.fail_after(120):
        async with (
            http_server.client(modes[0]) as c0,
            http_server.client(modes[1]) as c1,
            http_server.client(modes[2]) as c2,
        ):
            clients = [c0, c1, c2]
            for i, client in enumerate(clients):  # each session made (and its working directory) first
                r = await client.call_tool("run_code", {"code": "1", "session_id": f"par-{i}"})
                assert not r.is_error, r
            places = [next(http_server.data_dir.rglob(f"par-{i}/files")) for i in range(3)]
            answers: dict[int, str] = {}

            async def one(i: int) -> None:
                r = await clients[i].call_tool(
                    "run_code", {"code": f"{code}'done {i}'", "session_id": f"par-{i}"}
                )
                assert not r.is_error, r
                answers[i] = r.structured_content["results"][0]["text"]  # type: ignore[index]

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                with anyio.move_on_after(60):
                    while not all((p / "started").exists() for p in places):  # noqa: ASYNC110 - files the code writes
                        await anyio.sleep(0.02)
                started = sum((p / "started").exists() for p in places)
                for p in places:
                    (p / "go").touch()  # release them (also when the check below fails)
            assert started == 3, f"calls were serialised: {started} of 3 started together"
    assert answers == {i: f"'done {i}'" for i in range(3)}


def test_accepted_connections_send_without_nagle_delay() -> None:
    """Responses go out as written: TCP_NODELAY on every accepted socket.

    Without it a response written as headers then body waits for the client's delayed ACK
    (≈ 40 ms a call on Linux). asyncio sets TCP_NODELAY only on sockets whose ``proto`` is
    IPPROTO_TCP, so the listening socket must say so (and carry the option itself).
    """
    listener = bind_socket("127.0.0.1", 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP
        client = socket.create_connection(listener.getsockname()[:2])
        listener.setblocking(True)
        accepted, _ = listener.accept()
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert accepted.proto == socket.IPPROTO_TCP
    finally:
        listener.close()

"""Requests MCP cannot serve get a JSON-RPC error that says why, over real HTTP; the server keeps serving.

A batch, an ``id`` that is not a string or an integer, and a body over ``--max-request-mb``
— in both protocol eras, sent raw with ``httpx2`` and (for the size limit) through the
SDK's own client, which must show the server's sentence rather than "Server returned an
error response". After each refusal a normal client still gets answers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.transport.procs import HttpServer, start_http

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.anyio, pytest.mark.slow]

LEGACY, MODERN = "2025-11-25", "2026-07-28"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
}
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    srv = start_http(tmp_path_factory.mktemp("protocol"), "--sandbox", "none", "--max-request-mb", "1")
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log_text()


@pytest.fixture
async def legacy_headers(server: HttpServer) -> AsyncIterator[dict[str, str]]:
    """Headers of an initialized handshake-era session."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(server.url, json=init, headers=ACCEPT)
        assert r.status_code == 200, r.text
        headers = {**ACCEPT, "Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": LEGACY}
        r = await http.post(
            server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )
        assert r.status_code == 202
        yield headers


def modern_headers(method: str) -> dict[str, str]:
    return {**ACCEPT, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}


async def post(
    server: HttpServer, body: str | bytes | AsyncIterator[bytes], headers: dict[str, str]
) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=60) as http:
        return await http.post(server.url, content=body, headers=headers)


def refusal(response: httpx2.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32600
    message = body["error"]["message"]
    assert "Nothing was done" in message and "validation error" not in message
    return message


async def assert_still_serving(server: HttpServer) -> None:
    with anyio.fail_after(30):
        async with server.client("auto") as client:
            result = await client.call_tool("memory_list", {})
            assert not result.is_error, result


def tools_list(rid: Any, meta: bool) -> str:
    params = {"_meta": MODERN_META} if meta else {}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/list", "params": params})


# --- batches ---------------------------------------------------------------------------------
async def test_a_batch_is_refused_in_the_handshake_era(
    server: HttpServer, legacy_headers: dict[str, str]
) -> None:
    batch = f"[{tools_list(2, False)}, {tools_list(3, False)}]"
    message = refusal(await post(server, batch, legacy_headers), 400)
    assert "batch requests are not supported" in message and "its own POST" in message
    await assert_still_serving(server)


async def test_a_batch_is_refused_in_the_sessionless_era(server: HttpServer) -> None:
    message = refusal(await post(server, f"[{tools_list(2, True)}]", modern_headers("tools/list")), 400)
    assert "batch requests are not supported" in message
    await assert_still_serving(server)


# --- ids -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rid", "kind"),
    [({"a": 1}, "an object"), ([1], "an array"), (True, "a boolean"), (1.5, "a fraction"), (None, "null")],
)
async def test_an_id_that_is_not_a_string_or_integer_is_refused(
    server: HttpServer, legacy_headers: dict[str, str], rid: Any, kind: str
) -> None:
    for body, headers in [
        (tools_list(rid, False), legacy_headers),
        (tools_list(rid, True), modern_headers("tools/list")),
    ]:
        message = refusal(await post(server, body, headers), 400)
        assert f'"id" must be a string or an integer; this request\'s id is {kind}' in message
    await assert_still_serving(server)


async def test_string_and_integer_ids_still_work(server: HttpServer, legacy_headers: dict[str, str]) -> None:
    for rid in ["req-1", 7]:
        response = await post(server, tools_list(rid, False), legacy_headers)
        assert response.status_code == 200, response.text
        assert f'"id":{json.dumps(rid)}' in response.text.replace(" ", "")


# --- size -----------------------------------------------------------------------------------
HEAD = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"upload_file","arguments":{"content":"'
)


async def chunks(megabytes: int, tail: bytes = b"") -> AsyncIterator[bytes]:
    yield HEAD
    for _ in range(megabytes):
        yield b"a" * MIB
    yield tail


async def test_a_200_mb_body_gets_a_413_that_says_what_to_do(server: HttpServer) -> None:
    tail = b'", "path": "x"}}}'
    headers = {**modern_headers("tools/call"), "Content-Length": str(len(HEAD) + 200 * MIB + len(tail))}
    message = refusal(await post(server, chunks(200, tail), headers), 413)
    assert "This request is 200.0 MB" in message
    assert "at most 1 MB (--max-request-mb / KERNMIND_MAX_REQUEST_MB)" in message
    await assert_still_serving(server)


async def test_a_streamed_body_without_length_is_cut_at_the_limit(server: HttpServer) -> None:
    message = refusal(await post(server, chunks(50), modern_headers("tools/call")), 413)
    assert "This request is more than 1 MB" in message
    await assert_still_serving(server)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_shows_the_servers_sentence(server: HttpServer, mode: str) -> None:
    with anyio.fail_after(60):
        async with server.client(mode) as client:
            with pytest.raises(MCPError) as raised:
                await client.call_tool("upload_file", {"path": "big.txt", "content": "a" * (2 * MIB)})
            assert "at most 1 MB" in str(raised.value) and "several smaller calls" in str(raised.value)
            small = await client.call_tool("upload_file", {"path": "small.txt", "content": "a" * 1000})
            assert not small.is_error, small  # the same client goes on

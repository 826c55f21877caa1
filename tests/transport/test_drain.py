"""The drain of an orderly HTTP stop (transport/drain.py): what is in flight answers, what is new
is refused in words.

The end-to-end case (a real server stopped while a call runs) is in test_shutdown.py; these
tests pin the middleware's own rules on a small ASGI app, driven by the real httpx2 client and
by the real MCP SDK client (which must surface the refusal as an error for its request, not as
a transport failure).
"""

from __future__ import annotations

import json

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from kernmind.transport.drain import SHUTTING_DOWN, Drain

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


class SlowApp:
    """Answers each request once ``release`` is set; records what reached it."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.seen: list[str] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(scope["method"])
        self.entered.set()
        await self.release.wait()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"answered"})


def client_for(app: object) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_in_flight_request_answers_and_new_ones_are_refused_in_words() -> None:
    app = SlowApp()
    drain = Drain(app)
    async with client_for(drain) as http, anyio.create_task_group() as tg:
        answers: list[httpx2.Response] = []

        async def in_flight() -> None:
            answers.append(await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}))

        tg.start_soon(in_flight)
        await app.entered.wait()
        assert drain.in_flight == 1
        drain.start()
        assert not await drain.wait_idle(timeout=0.2)  # the request in flight holds the drain

        refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": "req-7", "method": "tools/call"})
        assert refused.status_code == 503
        assert refused.headers["connection"] == "close"
        body = refused.json()
        assert body == {"jsonrpc": "2.0", "id": "req-7", "error": {"code": -32000, "message": SHUTTING_DOWN}}
        stream = await http.get("/mcp")  # a new event stream is refused too
        assert stream.status_code == 503 and stream.json()["id"] is None
        assert app.seen == ["POST"], "a refused request reached the app"

        app.release.set()
        assert await drain.wait_idle(timeout=5)
    assert [a.text for a in answers] == ["answered"]
    assert drain.in_flight == 0


async def test_session_end_passes_while_draining() -> None:
    app = SlowApp()
    app.release.set()
    drain = Drain(app)
    drain.start()
    async with client_for(drain) as http:
        assert (await http.delete("/mcp")).status_code == 200
        garbled = await http.post("/mcp", content=b"{not json")
        assert garbled.status_code == 503 and json.loads(garbled.content)["id"] is None
    assert app.seen == ["DELETE"]


async def test_the_sdk_client_reports_the_refusal_as_an_error_of_its_request() -> None:
    """A client that connects while the server drains gets the sentence, not a transport error."""
    drain = Drain(SlowApp())
    drain.start()
    http = client_for(drain)
    with pytest.raises(BaseException) as caught:
        async with Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http), mode="legacy"):
            pass
    leaves = list(_leaves(caught.value))
    assert leaves and all(isinstance(e, MCPError) for e in leaves), leaves  # no httpx2.TransportError
    assert all(SHUTTING_DOWN in str(e) for e in leaves), leaves


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside the SDK's task groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]

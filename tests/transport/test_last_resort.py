"""The outermost middleware (guard.LastResort): a failure inside answers that request only, in
words with a ref, never a bare "Internal Server Error" (fast; a Starlette app like the SDK's
stands inside, with Starlette's own error middleware that sends a plain 500 and re-raises)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kernmind.transport.guard import LastResort

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


async def boom(request: Request) -> JSONResponse:
    raise RuntimeError("Task group is not initialized. Make sure to use run().")


async def meant(request: Request) -> JSONResponse:
    return JSONResponse({"error": "a 500 the app meant"}, status_code=500)


APP = Starlette(routes=[Route("/boom", boom, methods=["POST"]), Route("/meant", meant, methods=["POST"])])


async def post(path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    await LastResort(APP)(scope, receive, send)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent  # one answer, whatever happened inside
    return starts[0]["status"], b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body"
    )


async def test_a_failure_inside_is_answered_in_words_with_a_ref() -> None:
    status, body = await post("/boom")
    assert status == 500
    message = json.loads(body)["error"]["message"]
    assert message.startswith("internal error (ref ") and "give the ref" in message


async def test_a_500_the_app_meant_is_passed_on() -> None:
    status, body = await post("/meant")
    assert status == 500 and json.loads(body) == {"error": "a 500 the app meant"}

"""The guard's rule on request ids (transport/guard.py), against a stand-in for the SDK's HTTP app:
an id still being answered in a session is refused; once its answer has been sent, the id is free
again at once, even while the app that answered is still unwinding.

(The same rule against the real server: test_chaos.py's
``test_a_request_id_still_being_answered_in_the_session_is_refused_not_lost``.)
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc
import pytest
from starlette.types import Message, Receive, Scope, Send

from kernmind.transport.guard import JsonRpcGuard

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


class SlowToUnwind:
    """Answers each request at once, then stays in the call until ``unwind`` is set (as the SDK's
    app may, closing an event stream, after the client already has the whole answer)."""

    def __init__(self) -> None:
        self.answered = 0
        self.unwind = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = json.loads((await receive())["body"])
        self.answered += 1
        body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        await self.unwind.wait()


def post(session: str = "s1") -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "headers": [(b"content-type", b"application/json"), (b"mcp-session-id", session.encode())],
    }


async def call(
    tg: anyio.abc.TaskGroup, guard: JsonRpcGuard, rid: Any, session: str = "s1"
) -> tuple[int, dict[str, Any]]:
    """One POST of a ``tools/list`` with id ``rid`` in ``tg``: (status, the JSON body), as soon as the
    body is complete (the exchange itself may go on: the app may still be unwinding)."""
    sent: list[Message] = []
    done = anyio.Event()

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    tg.start_soon(guard, post(session), _body(rid), send)
    await done.wait()
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent))


async def test_an_id_is_free_again_as_soon_as_its_answer_is_sent() -> None:
    app = SlowToUnwind()
    guard = JsonRpcGuard(app, max_body=1 << 20, limit_setting="--max-request-mb")
    async with anyio.create_task_group() as tg:
        assert (await call(tg, guard, 2))[0] == 200
        assert (await call(tg, guard, 2))[0] == 200  # the first exchange has not returned yet
        app.unwind.set()
    assert app.answered == 2


async def test_an_id_still_being_answered_is_refused_and_others_are_not() -> None:
    app = SlowToUnwind()
    guard = JsonRpcGuard(app, max_body=1 << 20, limit_setting="--max-request-mb")
    holding = anyio.Event()

    async def never_answers(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        holding.set()
        await anyio.sleep_forever()

    guard.app = never_answers
    async with anyio.create_task_group() as tg:
        tg.start_soon(guard, post(), _body(7), _discard)
        await holding.wait()
        guard.app = app
        status, reply = await call(tg, guard, "7")  # "7" and 7 are one id to the SDK
        assert status == 409 and reply["error"]["message"].startswith("A request with the id"), reply
        assert (await call(tg, guard, 8))[0] == 200  # another id
        assert (await call(tg, guard, 7, session="s2"))[0] == 200  # the same id in another session
        tg.cancel_scope.cancel()
    assert app.answered == 2


def _body(rid: Any) -> Receive:
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/list", "params": {}}).encode()

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _discard(message: Message) -> None:
    pass

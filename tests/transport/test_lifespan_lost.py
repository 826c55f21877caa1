"""An HTTP server whose app lifespan ends while it serves stops (to be restarted) instead of
answering every later request with a 500.

A fake ASGI app stands in for the server (its lifespan fails on demand, as the real one did
when an exception cancelled its task group: "Task group is not initialized" for everyone);
the uvicorn server class is kernmind's own (transport/http.py). The real server's orderly stop
is tested in test_shutdown.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
import pytest

from kernmind.transport.http import _uvicorn_server_class, bind_socket

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


def crashing_app(crash: anyio.Event) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})

            async def fail() -> None:
                await crash.wait()
                raise RuntimeError("the lifespan's task group is gone")

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(fail)
                await receive()  # lifespan.shutdown: an ordinary stop
                tasks.cancel_scope.cancel()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


@pytest.mark.parametrize("crash_it", [True, False])
async def test_a_lost_lifespan_stops_the_server(crash_it: bool) -> None:
    import uvicorn

    crash = anyio.Event()
    config = uvicorn.Config(crashing_app(crash), lifespan="on", log_config=None)
    server = _uvicorn_server_class()(config)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: server.serve(sockets=[sock]))
            while not server.started:  # (uvicorn offers no event for it)
                assert not tasks.cancel_scope.cancel_called
                await anyio.sleep(0.01)
            async with httpx2.AsyncClient() as http:
                assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
            if crash_it:
                crash.set()  # the server stops by itself
            else:
                server.should_exit = True  # an ordinary stop: not a lost lifespan
    assert server.lifespan_lost is crash_it
    sock.close()

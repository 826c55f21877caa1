"""``kernmind ui``: the ``/ui`` pages on 127.0.0.1 for stdio users, with a one-time login link.

Design: the HTTP transport's ``/ui`` app alone on a loopback port, reading the data dir (docs/ui.md).
Error policy: a port that cannot be bound is one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

from kernmind.config import Settings


def add_parser(sub: Any, parent: argparse.ArgumentParser) -> None:
    ui = sub.add_parser("ui", parents=[parent], help="serve the memory and sessions pages on 127.0.0.1")
    ui.add_argument("--ui-port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port)")
    ui.add_argument("--ui-host", default="127.0.0.1", help="loopback address to listen on")


def run(args: argparse.Namespace, settings: Settings) -> int:
    import anyio

    from kernmind.transport.http import bind_socket, is_loopback

    if not is_loopback(args.ui_host):
        print(
            "kernmind: `kernmind ui` listens on a loopback address only (it logs in the local user).",
            file=sys.stderr,
        )
        return 2
    try:
        sock = bind_socket(args.ui_host, args.ui_port)
    except OSError as exc:
        print(f"kernmind: cannot listen on {args.ui_host}:{args.ui_port}: {exc}", file=sys.stderr)
        return 1
    return anyio.run(serve_ui, settings, sock)


async def serve_ui(settings: Settings, sock: Any) -> int:
    import uvicorn

    from kernmind.ui.app import UiApp
    from kernmind.ui.auth import local_auth
    from kernmind.ui.data import standalone

    auth = local_auth()
    ui = UiApp(auth)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with standalone(settings) as parts:
            ui.parts = parts
            yield

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                code = auth.one_time_code()
                print(f"kernmind: memory and sessions at http://{shown}:{port}/ui/", file=sys.stderr)
                print(
                    f"kernmind: log in once with http://{shown}:{port}/ui/login?once={code}", file=sys.stderr
                )
                sys.stderr.flush()

    config = uvicorn.Config(
        ui.starlette(lifespan), lifespan="on", log_config=None, access_log=False, server_header=False
    )
    try:
        await Server(config).serve(sockets=[sock])
    finally:
        sock.close()
    return 0

"""Running the server on a transport: stdio (what desktop clients launch) or HTTP."""

from __future__ import annotations

import logging

import anyio

from kernmind.config import Settings
from kernmind.server import create_server

log = logging.getLogger(__name__)


def serve(settings: Settings) -> int:
    server = create_server(settings)
    if settings.transport == "stdio":
        anyio.run(server.run_stdio_async)
        return 0
    raise SystemExit("kernmind: --transport http is not implemented yet")

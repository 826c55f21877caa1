"""Talking to a Jupyter Kernel Gateway or Enterprise Gateway: REST for kernels, one WebSocket per kernel.

Design: five REST calls and ``/api/kernels/{id}/channels`` (every channel as JSON tagged with
its ``channel``), messages built by ``jupyter_client.session.Session``, over tornado (why not
``jupyter_server``'s client: docs/deployment.md). One consumer per connection.

Error policy: ``GatewayUnavailable`` (a ``RuntimeUnavailable``) names the URL, the status and
what to check; ``KernelGone`` on 404; ``ChannelsClosed`` when a kernel's WebSocket closes.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernmind.execution.errors import RuntimeUnavailable

log = logging.getLogger(__name__)

DELETE_ATTEMPTS = 3
PING_INTERVAL = 10.0  # seconds between WebSocket pings; a gateway that misses a pong for as long is gone


class GatewayUnavailable(RuntimeUnavailable):
    """The gateway cannot be reached, or refused a request (the message says which and why)."""


class KernelGone(Exception):
    """The gateway no longer knows this kernel (it was stopped, culled, or the gateway restarted)."""


class ChannelsClosed(Exception):
    """A kernel's WebSocket closed (the gateway stopped, or the kernel was shut down)."""


@dataclass(frozen=True)
class GatewayConfig:
    url: str  # http(s)://host:port[/base]
    token: str | None = None
    request_timeout: float = 30.0  # seconds for one REST call (starting a kernel has its own)
    start_timeout: float = 120.0  # seconds for a kernel to start and answer (a pod may be scheduled)
    max_message_bytes: int = 64 * 1024 * 1024  # one WebSocket message (a large image display)

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    @property
    def ws_base(self) -> str:
        return "ws" + self.base[4:] if self.base.startswith("http") else self.base


class KernelGateway:
    """The gateway's REST API (see the module docstring)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._http = AsyncHTTPClient()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.config.token:
            headers["Authorization"] = f"token {self.config.token}"
        return headers

    async def _request(
        self, method: str, path: str, body: Any = None, *, timeout: float | None = None
    ) -> Any:
        url = f"{self.config.base}{path}"
        request = HTTPRequest(
            url,
            method=method,
            headers=self._headers(),
            body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
            request_timeout=timeout or self.config.request_timeout,
            connect_timeout=min(10.0, timeout or self.config.request_timeout),
        )
        try:
            response = await self._http.fetch(request)
        except HTTPClientError as exc:
            if exc.code == 404 and path.startswith("/api/kernels/"):
                raise KernelGone(path) from exc
            raise GatewayUnavailable(self._refusal(method, path, exc)) from exc
        except (OSError, TimeoutError) as exc:
            raise GatewayUnavailable(
                f"the kernel gateway at {self.config.base} is unreachable ({exc or type(exc).__name__})"
            ) from exc
        return json.loads(response.body) if response.body else None

    def _refusal(self, method: str, path: str, exc: HTTPClientError) -> str:
        detail = ""
        if exc.response is not None and exc.response.body:
            try:
                detail = str(json.loads(exc.response.body).get("message") or "")
            except (ValueError, AttributeError):
                detail = exc.response.body[:200].decode(errors="replace")
        where = f"the kernel gateway at {self.config.base} refused {method} {path}"
        if exc.code in (401, 403):
            return f"{where} ({exc.code}: {detail or exc.message}): check --kernel-gateway-token"
        if exc.code == 599:  # tornado's code for a connection that failed or timed out
            return f"the kernel gateway at {self.config.base} is unreachable ({exc.message})"
        return f"{where} ({exc.code}: {detail or exc.message})"

    async def kernelspecs(self) -> dict[str, Any]:
        return await self._request("GET", "/api/kernelspecs")

    async def start_kernel(self, name: str, env: dict[str, str]) -> str:
        """Start a kernel of kernelspec ``name``; its id. ``env`` keys must start with ``KERNEL_``."""
        model = await self._request(
            "POST", "/api/kernels", {"name": name, "env": env}, timeout=self.config.start_timeout
        )
        return str(model["id"])

    async def kernel(self, kernel_id: str) -> dict[str, Any]:
        """The kernel's model (``execution_state``, ``last_activity``…); ``KernelGone`` when unknown."""
        return await self._request("GET", f"/api/kernels/{quote(kernel_id)}")

    async def interrupt(self, kernel_id: str) -> None:
        await self._request("POST", f"/api/kernels/{quote(kernel_id)}/interrupt")

    async def delete(self, kernel_id: str) -> None:
        """Stop a kernel; one the gateway no longer knows is already stopped."""
        for attempt in range(DELETE_ATTEMPTS):
            try:
                await self._request("DELETE", f"/api/kernels/{quote(kernel_id)}")
                return
            except KernelGone:
                return
            except GatewayUnavailable as exc:
                # Kernel Gateway answers 500 while it restarts a kernel that died: try again.
                if "(500" not in str(exc) or attempt == DELETE_ATTEMPTS - 1:
                    raise
                await anyio.sleep(1.0)

    async def connect(self, kernel_id: str, timeout: float | None = None) -> KernelChannels:
        """The kernel's channels (``KernelGone`` when the gateway does not know it). The gateway
        answers the handshake once the kernel answers it, so a kernel just started is given
        ``timeout`` (the start's) rather than one REST call's."""
        timeout = timeout or self.config.request_timeout
        request = HTTPRequest(
            f"{self.config.ws_base}/api/kernels/{quote(kernel_id)}/channels",
            headers=self._headers(),
            connect_timeout=timeout,
            request_timeout=timeout,
        )
        try:
            conn = await websocket_connect(
                request,
                ping_interval=PING_INTERVAL,
                ping_timeout=PING_INTERVAL,
                max_message_size=self.config.max_message_bytes,
            )
        except HTTPClientError as exc:
            if exc.code == 404:
                raise KernelGone(kernel_id) from exc
            raise GatewayUnavailable(self._refusal("GET", f"/api/kernels/{kernel_id}/channels", exc)) from exc
        except (OSError, TimeoutError) as exc:
            raise GatewayUnavailable(
                f"the kernel gateway at {self.config.base} is unreachable ({exc or type(exc).__name__})"
            ) from exc
        return KernelChannels(conn)


class KernelChannels:
    """One kernel's channels over its WebSocket: send requests, receive replies and output."""

    def __init__(self, conn: WebSocketClientConnection) -> None:
        self._conn = conn
        # The key only silences jupyter_client's warning: JSON frames carry no signature (the
        # gateway signs what it forwards to the kernel with the kernel's own key).
        self.session = Session(key=secrets.token_bytes(16), username="kernmind")
        self.closed = False

    def send(self, channel: str, msg_type: str, content: dict[str, Any], **fields: Any) -> str:
        """Send a request; its ``msg_id`` (the ``parent_header`` of what answers it)."""
        if self.closed:
            raise ChannelsClosed("the kernel's connection is closed")
        msg = self.session.msg(msg_type, content)
        msg.update(fields)
        msg["channel"] = channel
        self._conn.write_message(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True, **extra: Any) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history and not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
            **extra,
        }
        return self.send("shell", "execute_request", content)

    async def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message (with its ``channel``), or None after ``timeout`` seconds.
        Raises ``ChannelsClosed`` once the connection is gone."""
        if self.closed:
            raise ChannelsClosed("the kernel's connection is closed")
        with anyio.move_on_after(timeout):
            raw = await self._conn.read_message()
            if raw is None:
                self.closed = True
                reason = self._conn.close_reason or f"code {self._conn.close_code}"
                raise ChannelsClosed(f"the gateway closed the kernel's connection ({reason})")
            return json.loads(raw)
        return None

    def close(self) -> None:
        self.closed = True
        self._conn.close()

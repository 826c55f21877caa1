"""One session kernel's code-mode channel: a Unix socket in the kernel's private socket directory.

Design
- The socket is made when a kernel joins a session (``CodeMode.joined``) as ``tools.sock`` in
  that kernel's socket directory: a 0700 directory of this server's run directory that only this
  kernel's sandbox mounts (at ``/run/kernmind``), so no other session's code can even see it,
  and no network is involved. It is owned by the kernel's sandbox uid, mode 0600, and goes when
  the kernel stops (``Kernel.on_stop``: ``reset``, close, unload, server stop).
- A connection is accepted only from the kernel's own uid (``SO_PEERCRED``): a process of
  another sandbox uid that got hold of the path is refused with a sentence and nothing runs.
  (Without a sandbox, ``--sandbox none``, every session runs as the server's user and nothing
  separates sessions, this socket included.)
- The protocol is one JSON object per line each way: ``{"op": "describe"}`` or
  ``{"op": "call", "tool": …, "arguments": {…}}``, answered ``{"ok": true, …}`` or
  ``{"ok": false, "error": "<sentence>"}`` (with ``"closed": true`` when the connection is
  closed after it: a refused peer, too many connections, an oversized request). A connection serves its requests one at a time
  (the client opens one per thread); a channel holds at most ``MAX_CONNECTIONS``.

Error policy: a malformed or oversized request is answered with a sentence, and an oversized
one also closes the connection (its end cannot be found); a client that goes away mid-call
leaves the call to finish (its write is not half done) and its answer is dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from kernmind.codemode.dispatch import ToolDispatch
from kernmind.principals import Principal

log = logging.getLogger(__name__)

SOCKET_NAME = "tools.sock"
MAX_CONNECTIONS = 16
ENOUGH = 2  # two connections past the cap are told why, the rest simply closed


class Channel:
    """The listening socket of one kernel, answering for ``principal`` and ``session_id``."""

    def __init__(
        self,
        path: Path,
        principal: Principal,
        session_id: str,
        uid: int,
        dispatch: ToolDispatch,
        max_request_bytes: int,
    ) -> None:
        self.path = path
        self.principal = principal
        self.session_id = session_id
        self.uid = uid  # the only uid allowed to connect
        self.dispatch = dispatch
        self.max_request_bytes = max_request_bytes
        self.scope = anyio.CancelScope()
        self._connections = 0

    @classmethod
    async def open(
        cls,
        directory: Path,
        principal: Principal,
        session_id: str,
        uid: int | None,
        dispatch: ToolDispatch,
        max_request_bytes: int,
    ) -> tuple[Channel, SocketListener]:
        path = directory / SOCKET_NAME
        path.unlink(missing_ok=True)
        listener = await anyio.create_unix_listener(path, mode=0o600)
        if uid is not None:
            os.chown(path, uid, uid, follow_symlinks=False)
        channel = cls(
            path, principal, session_id, os.getuid() if uid is None else uid, dispatch, max_request_bytes
        )
        return channel, listener

    def stop(self) -> None:
        """Stop listening and drop the connections (the kernel stopped); synchronous, for ``on_stop``."""
        self.scope.cancel()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)

    async def serve(self, listener: SocketListener) -> None:
        with self.scope:
            async with listener:
                await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        async with stream:
            refusal = self._refusal(stream)
            if refusal is not None:
                log.warning(
                    "code mode: %s (session %r of %r)", refusal, self.session_id, self.principal.owner
                )
                await _send(stream, {"ok": False, "error": refusal, "closed": True})
                return
            self._connections += 1
            try:
                if self._connections > MAX_CONNECTIONS:
                    await _send(
                        stream,
                        {
                            "ok": False,
                            "closed": True,
                            "error": f"too many connections to code mode from this session (at most "
                            f"{MAX_CONNECTIONS} threads or processes may call tools at once); use fewer threads.",
                        },
                    )
                    return
                await self._requests(stream)
            finally:
                self._connections -= 1

    def _refusal(self, stream: SocketStream) -> str | None:
        raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
        try:
            creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError as exc:
            return f"cannot tell who is connecting ({exc.strerror or exc}); connection refused"
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != self.uid:
            return (
                f"connection refused: this channel belongs to another session's code (peer uid {uid}); "
                "use kernmind_tools from code run in your own session"
            )
        return None

    async def _requests(self, stream: SocketStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                line = await reader.receive_until(b"\n", self.max_request_bytes)
            except (
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
            ):
                return
            except anyio.DelimiterNotFound:
                await _send(
                    stream,
                    {
                        "ok": False,
                        "closed": True,
                        "error": f"the request is larger than {self.max_request_bytes // (1024 * 1024)} MiB; "
                        "send less per call (e.g. one passage per archival_memory_insert).",
                    },
                )
                return
            answer = await self._answer(line)
            try:
                await _send(stream, answer)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the client went away (an interrupt): the call itself is complete

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return {
                "ok": False,
                "error": "the request is not valid JSON (kernmind_tools sends one object per line).",
            }
        if not isinstance(request, dict):
            return {"ok": False, "error": "the request must be a JSON object."}
        op = request.get("op")
        if op == "describe":
            return await self.dispatch.describe()
        if op == "call":
            # Shielded: a kernel stopping mid-call must not cut a memory write in half.
            with anyio.CancelScope(shield=True):
                return await self.dispatch.call(
                    self.principal, self.session_id, request.get("tool"), request.get("arguments", {})
                )
        return {"ok": False, "error": "unknown request: 'op' must be 'describe' or 'call'."}


async def _send(stream: SocketStream, answer: dict[str, Any]) -> None:
    # ASCII with escapes: a lone surrogate in stored text still travels as valid JSON.
    await stream.send(json.dumps(answer, default=str).encode("ascii") + b"\n")

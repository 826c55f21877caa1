"""One session kernel's code-mode channel: a Unix socket in the kernel's private socket directory.

Design: docs/code-mode.md ("The channel"); only the kernel's own uid is accepted (``SO_PEERCRED``),
one JSON object per line each way, at most ``MAX_CALLS`` served at once and ``MAX_CONNECTIONS`` open.
Error policy: an unreadable request is answered in a sentence (an oversized or truncated one also
closes the connection); a peer that went away ends its own connection only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream

from kernmind import supervise
from kernmind.codemode.dispatch import ToolDispatch
from kernmind.principals import Principal

log = logging.getLogger(__name__)

SOCKET_NAME = "tools.sock"
MAX_CALLS = 16  # requests of one channel read and answered at once (the others wait their turn)
MAX_CONNECTIONS = 64  # open connections of one channel (idle ones included: each is a descriptor)
ENOUGH = 2  # two connections past the cap are told why, the rest simply closed
CHUNK = 65536
SHORT_OF = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
BACKLOG = 65536  # connections waiting to be accepted, as anyio sets (the cap above is what is served)
ACCEPT_PAUSE = 0.1  # seconds between tries to accept while the server is short of descriptors
# A peer gone away: its connection ends, quietly.
GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class Oversize(Exception):
    pass


class Truncated(Exception):
    pass


class Lines:
    """Newline-ended requests read from one connection, each at most ``limit`` bytes."""

    def __init__(self, stream: SocketStream, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.buffer = bytearray()
        self.scanned = 0  # bytes of the buffer known to hold no newline

    async def waiting(self) -> bool:
        """Wait until a request starts arriving; False when the peer closed (or broke) first."""
        if self.buffer:
            return True
        try:
            self.buffer += await self.stream.receive(CHUNK)
        except GONE:
            return False
        return True

    async def line(self) -> bytes:
        """The next line (without its newline); ``Oversize`` past the limit, ``Truncated`` when
        the peer stopped sending before its newline."""
        while True:
            end = self.buffer.find(b"\n", self.scanned)
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buffer)
            if len(self.buffer) > self.limit:
                raise Oversize
            try:
                self.buffer += await self.stream.receive(CHUNK)
            except anyio.EndOfStream:
                raise Truncated from None


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
        self.calls = anyio.CapacityLimiter(MAX_CALLS)
        self._connections = 0
        self._listener: SocketListener | None = None

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
        channel = cls(
            path, principal, session_id, os.getuid() if uid is None else uid, dispatch, max_request_bytes
        )
        return channel, await channel._listen()

    async def _listen(self) -> SocketListener:
        """A fresh listening socket at ``path``, owned by the kernel's uid, mode 0600. Made under
        another name and renamed into place, so a socket being replaced stays reachable until
        its successor is ready."""
        fresh = self.path.with_name(self.path.name + ".new")
        fresh.unlink(missing_ok=True)
        # Made here, not with anyio.create_unix_listener: that binds on a worker thread, and the
        # hop cost a --stateless call milliseconds while the previous call's clean-up ran on the
        # other workers; a bind in the kernel's own local directory does not block.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fsdecode(fresh))
            os.chmod(fresh, 0o600)
            if self.uid != os.getuid():
                os.chown(fresh, self.uid, self.uid, follow_symlinks=False)
            sock.listen(BACKLOG)
            listener = await SocketListener.from_socket(sock)
        except BaseException:
            sock.close()
            fresh.unlink(missing_ok=True)
            raise
        try:
            os.replace(fresh, self.path)
        except BaseException:
            await listener.aclose()
            fresh.unlink(missing_ok=True)
            raise
        return listener

    @property
    def what(self) -> str:
        return f"code mode of session {self.session_id!r} of {self.principal.owner!r}"

    def stop(self) -> None:
        """Stop listening and drop the connections (the kernel stopped); synchronous, for ``on_stop``."""
        self.scope.cancel()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)

    async def serve(self, listener: SocketListener) -> None:
        """Accept connections until ``stop``; never raises (supervised, see the module docstring)."""
        self._listener = listener
        with self.scope:
            async with supervise.task_group(self.what) as connections:
                await supervise.service(f"{self.what}: listener", self._accept, connections)

    async def _accept(self, connections: supervise.Supervised) -> None:
        listener = self._listener
        self._listener = None  # a restart after a failure makes the socket again
        if listener is None:
            listener = await self._listen()
        short = False  # short of descriptors now (said once per spell)
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except (OSError, anyio.BrokenResourceError) as exc:  # anyio wraps accept's OSError
                    if getattr(exc.__cause__ or exc, "errno", None) not in SHORT_OF:
                        raise  # the listener itself failed: the service makes it again
                    # Out of descriptors or memory for now (the server's, shared by everyone): the
                    # socket is fine; wait a moment instead of spinning, and accept again.
                    if not short:
                        why = exc.__cause__ or exc
                        log.warning("%s: cannot accept a connection now (%s); trying again", self.what, why)
                    short = True
                    await anyio.sleep(ACCEPT_PAUSE)
                    continue
                if short:
                    log.info("%s: accepting connections again", self.what)
                short = False
                connections.start_soon(self._connection, stream, name="connection")

    async def _connection(self, stream: SocketStream) -> None:
        async with stream:
            refusal = self._refusal(stream)
            if refusal is not None:
                log.warning("%s: %s", self.what, refusal)
                await _send(stream, {"ok": False, "error": refusal, "closed": True})
                return
            self._connections += 1
            try:
                if self._connections > MAX_CONNECTIONS:
                    if self._connections <= MAX_CONNECTIONS + ENOUGH:
                        await _send(
                            stream,
                            {
                                "ok": False,
                                "closed": True,
                                "error": f"too many connections to code mode from this session (at most "
                                f"{MAX_CONNECTIONS} open at once, one per thread or process that calls "
                                "tools); close some, or use fewer threads.",
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
        lines = Lines(stream, self.max_request_bytes)
        while await lines.waiting():  # an idle connection waits here, holding no turn
            async with self.calls:
                try:
                    line = await lines.line()
                except Oversize:
                    mib = self.max_request_bytes / (1024 * 1024)
                    answer = _refused(
                        f"the request is larger than {mib:g} MiB; send less per call "
                        "(e.g. one passage per archival_memory_insert).",
                        closed=True,
                    )
                except Truncated:
                    answer = _refused(
                        "the request ended before its end of line (the connection was closed mid-request); "
                        "kernmind_tools sends one JSON object per line.",
                        closed=True,
                    )
                except GONE:
                    return
                else:
                    answer = await self._answer(line)
            if not await _send(stream, answer) or answer.get("closed"):
                return

    async def _answer(self, line: bytes) -> dict[str, Any]:
        request = _parsed(line)
        if isinstance(request, str):
            return _refused(request)
        op = request.get("op")
        if op == "describe":
            return await self.dispatch.describe()
        if op == "call":
            # Shielded: a kernel stopping mid-call must not cut a memory write in half.
            with anyio.CancelScope(shield=True):
                return await self.dispatch.call(
                    self.principal, self.session_id, request.get("tool"), request.get("arguments", {})
                )
        return _refused("unknown request: 'op' must be 'describe' or 'call'.")


def _parsed(line: bytes) -> dict[str, Any] | str:
    """The request on ``line``, or why it is not one (a sentence)."""
    how = "kernmind_tools sends one JSON object per line"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the request is not valid UTF-8 (byte {exc.start}); {how}."
    try:
        request = json.loads(text)
    except RecursionError:
        return f"the request is nested too deeply to read; {how}."
    except ValueError as exc:
        return f"the request is not valid JSON ({str(exc)[:200]}); {how}."
    if not isinstance(request, dict):
        return f"the request must be a JSON object, not {type(request).__name__}; {how}."
    return request


def _refused(sentence: str, *, closed: bool = False) -> dict[str, Any]:
    return {"ok": False, "error": sentence, **({"closed": True} if closed else {})}


async def _send(stream: SocketStream, answer: dict[str, Any]) -> bool:
    """Send ``answer``; False when the peer went away (nothing is raised)."""
    # ASCII with escapes: a lone surrogate in stored text still travels as valid JSON.
    data = json.dumps(answer, default=str).encode("ascii") + b"\n"
    try:
        await stream.send(data)
    except GONE:
        return False
    return True

"""A local kernel's channel: how one request's messages come and go over its ZeroMQ sockets.

Design
- ``ZmqChannel`` is the ``exchange.Channel`` of a local (or fork-server) kernel for one request:
  it sends the request through the kernel's ``jupyter_client`` client, reads the kernel's iopub
  and shell sockets, and checks about twice a second that the kernel's process is alive (a
  kernel that dies mid-call sends nothing more).
- A message already waiting is read at once from a blocking-free view of the same socket
  (``zmq.Socket.shadow``); only an empty socket is polled, with one future. jupyter_client's
  ``get_msg`` awaits a poll future and then a receive future for every message. A request
  whose messages keep waiting (a flood of displays) still lets the event loop run every
  ``READS_PER_YIELD`` messages, so other clients' calls are not held up by it.
- Messages are unpacked by ``read_message``: jupyter_client's checks, without parsing dates.

Error policy: a socket closed by our own shutdown under the call raises ``KernelLost("closed")``
(told apart from a caller's cancellation); a message that cannot be unpacked raises
``ValueError``/``TypeError``, which ``exchange`` counts as malformed and skips; anything else
propagates.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from kernmind.execution.kernels.exchange import KernelLost

if TYPE_CHECKING:
    from kernmind.execution.kernels.local import Kernel

POLL_INTERVAL = 0.5  # seconds between checks that a running kernel's process is alive
READS_PER_YIELD = 64  # messages read without waiting before the event loop gets a turn


def read_message(session: Any, frames: list[bytes]) -> dict[str, Any]:
    """A message from its ZeroMQ frames: jupyter_client's ``Session.deserialize`` (signature,
    replay and length checks; buffers; protocol adaptation) without turning the header's and
    parent header's date strings into datetimes, which nothing here reads and which was the
    largest part of unpacking a message. A bad message raises ``ValueError``/``TypeError``, as
    there (``exchange`` counts it as malformed)."""
    from jupyter_client.adapter import adapt

    _, frames = session.feed_identities(frames)
    if session.auth is not None:
        signature = frames[0]
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in session.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        session._add_digest(signature)
        if not hmac.compare_digest(signature, session.sign(frames[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
    if len(frames) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    header = session.unpack(frames[1])
    return adapt(
        {
            "header": header,
            "msg_id": header["msg_id"],
            "msg_type": header["msg_type"],
            "parent_header": session.unpack(frames[2]),
            "metadata": session.unpack(frames[3]),
            "content": session.unpack(frames[4]),
            "buffers": [memoryview(b) for b in frames[5:]],
        }
    )


class ZmqChannel:
    """A local kernel's ``exchange.Channel`` for one request: its client's iopub and shell
    sockets, with its process polled twice a second and our own shutdown told apart."""

    def __init__(self, kernel: Kernel) -> None:
        assert kernel.kc is not None
        self.kernel = kernel
        self.kc = kernel.kc
        self.next_poll = time.monotonic() + POLL_INTERVAL
        self.read_at_once = 0  # messages read in a row without waiting (see READS_PER_YIELD)
        self.views: dict[int, Any] = {}  # socket id -> its zmq.Socket.shadow (see _receive)

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        return self.kc.execute(code, silent=silent, store_history=store_history, allow_stdin=False)

    def _view(self, socket: Any) -> Any:
        """The blocking-free view of one of the client's sockets, to use at once: a view does not
        own its socket, so it is handed out only while the socket is open (a socket closed by a
        shutdown under the call raises, as the socket itself would)."""
        import zmq

        if socket.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        view = self.views.get(id(socket))
        if view is None:
            view = self.views[id(socket)] = zmq.Socket.shadow(socket.underlying)
        return view

    async def check(self) -> float | None:
        if self.kernel.closed:
            raise KernelLost("closed")
        now = time.monotonic()
        if now >= self.next_poll:  # on schedule even while output keeps arriving
            self.next_poll = now + POLL_INTERVAL
            if not await self.kernel.is_alive():
                raise KernelLost("died", exit_code=await self.kernel.exit_code())
        return self.next_poll

    async def output(self, timeout: float) -> Any:
        return await self._receive(self.kc.iopub_channel, timeout)

    async def reply(self, timeout: float) -> Any:
        return await self._receive(self.kc.shell_channel, timeout)

    async def _receive(self, channel: Any, timeout: float) -> Any:
        """The channel's next message, or None once ``timeout`` seconds pass without one.

        A message already waiting is read at once from a blocking-free view of the same socket
        (``zmq.Socket.shadow``): most of a request's messages are waiting by the time the one
        before them is folded in, and jupyter_client's ``get_msg`` would first await a poll
        future and then a receive future for each. Only when nothing waits is the socket polled
        (one future). Messages are unpacked by ``read_message``.
        """
        import zmq

        socket = channel.socket
        deadline = time.monotonic() + timeout
        try:
            if self.read_at_once >= READS_PER_YIELD:  # before reading: a cancel here loses nothing
                self.read_at_once = 0
                await anyio.lowlevel.checkpoint()
            while True:
                try:
                    frames = self._view(socket).recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    self.read_at_once = 0
                    left = deadline - time.monotonic()
                    if left <= 0 or not await socket.poll(max(1, int(left * 1000)), zmq.POLLIN):
                        return None
                    continue
                self.read_at_once += 1
                return read_message(channel.session, frames)
        except BaseException as exc:
            if self._stopped_under_us(exc):
                raise KernelLost("closed") from None
            raise

    def _stopped_under_us(self, exc: BaseException) -> bool:
        """True when ``exc`` comes from a concurrent shutdown closing our sockets, rather than
        from the caller (a closed socket cancels the pending zmq future: a CancelledError
        although nobody cancelled this task)."""
        if not self.kernel.closed:
            return False
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            return task is not None and task.cancelling() == 0
        return isinstance(exc, Exception)

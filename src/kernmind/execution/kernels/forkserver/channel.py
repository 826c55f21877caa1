"""``Channel``: one control socket to a fork-server template process (or its snapshot).

Design: SOCK_SEQPACKET, one JSON object a packet, descriptors as SCM_RIGHTS; one reader task
(``serve``) hands each reply to the request awaiting its id, other messages to a callback.

Error policy: when the process goes away every waiting request gets ``{"ok": false, "error": …}``
and later requests raise ``TemplateGone``; callers then start kernels the normal way.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import anyio

MAX_PACKET = 1 << 20


class TemplateGone(RuntimeError):
    """The template process died or closed its socket while a request was waiting."""


class Channel:
    """One control socket to a template process: requests go out with ids, and ``serve``
    hands each reply to the request awaiting it (other messages to ``on_message``)."""

    def __init__(self, sock: socket.socket, describe_exit: Callable[[], str]) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.describe_exit = describe_exit
        self.gone: str | None = None  # why it stopped, once it has
        self.retiring = False  # stop serving once no request waits (the snapshot, after preloads)
        self._ids = itertools.count(1)
        self._waiting: dict[str, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._serving: anyio.CancelScope | None = None

    async def receive(self) -> tuple[dict[str, Any], list[int]]:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, MAX_PACKET, 4)
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            if not data:
                for fd in fds:
                    os.close(fd)
                raise TemplateGone(f"the template exited ({self.describe_exit()})")
            return json.loads(data), fds

    async def serve(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        """Dispatch replies until the process goes away (or this channel retires); then fail
        every waiting request and close the socket."""
        try:
            with anyio.CancelScope() as self._serving:
                while self.gone is None and not (self.retiring and not self._waiting):
                    message, fds = await self.receive()
                    for fd in fds:  # only hello carries one; never leak them
                        os.close(fd)
                    entry = self._waiting.pop(str(message.get("id")), None)
                    if entry is not None:
                        entry[1].append(message)
                        entry[0].set()
                    elif "id" not in message:
                        on_message(message)
        except (TemplateGone, OSError, ValueError) as exc:
            self.gone = str(exc) or "the template closed its socket"
        finally:
            self.gone = self.gone or "retired"
            for event, box in self._waiting.values():
                box.append({"ok": False, "error": f"the fork-server template stopped: {self.gone}"})
                event.set()
            self._waiting.clear()
            self._serving = None
            self.close()

    def abandon(self, why: str) -> None:
        """Stop now: waiting requests fail with ``why``, the socket closes."""
        self.gone = why
        if self._serving is not None:
            self._serving.cancel()

    def retire(self) -> None:
        """Serve the requests already sent, then close (at once when none waits)."""
        self.retiring = True
        if not self._waiting and self._serving is not None:
            self._serving.cancel()

    async def request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        """Send one request and wait for its reply (the caller bounds the wait)."""
        if self.gone is not None:
            raise TemplateGone(self.gone)
        request_id = str(next(self._ids))
        event, box = anyio.Event(), []
        self._waiting[request_id] = (event, box)
        try:
            data = json.dumps({**message, "id": request_id}).encode()
            while True:
                try:
                    if fds:
                        socket.send_fds(self.sock, [data], list(fds))
                    else:
                        self.sock.send(data)
                    break
                except BlockingIOError:
                    await anyio.wait_writable(self.sock)
            await event.wait()
        finally:
            self._waiting.pop(request_id, None)
            if self.retiring and not self._waiting and self._serving is not None:
                self._serving.cancel()
        return box[0]

    def close(self) -> None:
        """Close the socket; while ``serve`` waits on it, ``serve`` closes it as it leaves.

        anyio keys a waiting reader by descriptor number: a number closed under a waiting reader
        can go to the next template's socket at once, and the old reader's cleanup would then
        unregister the new one ("Another task is already reading from this resource", or a
        read that never wakes)."""
        self.gone = self.gone or "closed"
        if self._serving is not None:
            self._serving.cancel()
            return
        with contextlib.suppress(OSError):
            self.sock.close()

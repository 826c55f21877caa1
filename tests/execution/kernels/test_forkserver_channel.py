"""The fork server's control channel: one closed while its reader still waits leaves the next
template's socket readable (replacing a template after dropped preloads once got "Another task
is already reading from this resource": the old descriptor number, closed under the waiting
reader, had gone to the new socket)."""

from __future__ import annotations

import json
import socket

import anyio
import pytest

from kernmind.execution.kernels.forkserver.channel import Channel

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


def _running() -> str:
    return "still running"


async def test_a_channel_closed_under_its_reader_leaves_its_descriptor_usable() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = Channel(ours, _running)
    async with anyio.create_task_group() as tg:
        tg.start_soon(old.serve, lambda message: None)
        await anyio.wait_all_tasks_blocked()  # the reader waits on the descriptor
        # what replacing a template does in one step: abandon, close, open the next socket
        old.abandon("replaced")
        old.close()
        theirs.close()
        new_ours, new_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        new = Channel(new_ours, _running)

        async def say_hello() -> None:
            await anyio.sleep(0.05)
            new_theirs.send(json.dumps({"op": "hello", "ok": True}).encode())

        tg.start_soon(say_hello)
        with anyio.fail_after(5):  # waits on the descriptor before the old reader has run again
            message, fds = await new.receive()
        assert message == {"op": "hello", "ok": True} and fds == []
    assert old.gone == "replaced" and old.sock.fileno() == -1  # closed by its reader as it left
    new.close()
    new_theirs.close()

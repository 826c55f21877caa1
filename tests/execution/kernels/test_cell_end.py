"""What a cell's end waits for, and what it does not (the setup cell, ``kernels/setup.py``).

Output a child process wrote to fd 1 or 2 just before the cell ended reaches that cell's
result, every time (ipykernel's fd watcher threads pass it on; the cell's end waits for them,
not for a fixed half millisecond). A process that keeps writing in the background does not
hold every cell's end. A flush with nothing to send makes no round trip to the kernel's I/O
thread, and what Python printed and displayed still arrives in the order it was made.

Through a real MCP server, in-process, on real (forked) kernels in the sandbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# The cell's stream, made slow to take what the fd watcher thread hands it (as on a loaded
# machine, where that thread waits its turn): the child's line is still in the watcher when
# the cell's own code is done. (The instance's ``write`` lasts until the next cell starts.)
SLOW_WATCHER = """
import os, sys, time
stream = sys.{stream}
def slow(text, _write=type(stream).write, _stream=stream):
    time.sleep(0.005)
    return _write(_stream, text)
stream.write = slow
os.system("echo from-a-child{redirect}")
"""


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    data = tmp_path_factory.mktemp("cell-end")
    async with Client(create_server(make_settings(data, embedding_model="none", pool_size=1))) as c:
        yield c


async def run(client: Client, code: str, session_id: str) -> dict[str, Any]:
    out = structured(await client.call_tool("run_code", {"code": code, "session_id": session_id}))
    assert out["status"] == "ok", out
    return out


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_what_a_child_wrote_just_before_the_cell_ended_is_in_its_result(
    client: Client, stream: str
) -> None:
    code = SLOW_WATCHER.format(stream=stream, redirect=" >&2" if stream == "stderr" else "")
    for attempt in range(5):
        out = await run(client, code, session_id=f"child-{stream}")
        assert "".join(out["logs"][stream]) == "from-a-child\n", attempt


async def test_a_process_that_keeps_writing_does_not_hold_the_cell_end(client: Client) -> None:
    """The watcher never gets back to waiting on an empty pipe (a child writes every 10 ms and
    the stream takes a second per write): the cell still ends, within its time limit."""
    sid = "chatty"
    code = SLOW_WATCHER.replace("0.005", "1").replace(
        'os.system("echo from-a-child{redirect}")',
        "import subprocess\n"
        "chatty = subprocess.Popen(['sh', '-c', 'while :; do echo tick; sleep 0.01; done'])\n"
        "time.sleep(0.1)",
    )
    try:
        out = structured(
            await client.call_tool(
                "run_code", {"code": code.format(stream="stdout"), "session_id": sid, "timeout": 20}
            )
        )
        assert out["status"] == "ok", out
        out = await run(client, "1 + 1", session_id=sid)
        assert out["results"][0]["text"] == "2"
    finally:
        await run(client, "chatty.kill(); chatty.wait()", session_id=sid)


async def test_a_flush_with_nothing_to_send_makes_no_round_trip(client: Client) -> None:
    await run(client, "print('a cell before: the stream is flushed at its end')", session_id="flush")
    out = await run(
        client,
        """
import sys
thread = sys.stdout.pub_thread
scheduled = []
schedule = thread.schedule
thread.schedule = lambda f: (scheduled.append(f), schedule(f))[1]
try:
    sys.stdout.flush()  # nothing written in this cell yet
    sys.stderr.flush()
    idle = len(scheduled)
    sys.stdout.write("pending")
    sys.stdout.flush()
    busy = len(scheduled) - idle
finally:
    thread.schedule = schedule
print()
(idle, busy > 0)
""",
        session_id="flush",
    )
    assert out["results"][0]["text"] == "(0, True)"
    assert "".join(out["logs"]["stdout"]) == "pending\n"


async def test_output_keeps_its_order_across_streams_and_displays(client: Client) -> None:
    """Skipped flushes change no order: what Python printed and displayed arrives as made. (A
    child's fd output reaches the stream through ipykernel's watcher thread, so where it lands
    among the cell's own later prints is not ordered, with or without kernmind: only that it is
    there.)"""
    out = await run(
        client,
        """
import subprocess, sys
from IPython.display import display
print("one")
display("two")
sys.stdout.flush()
print("three", file=sys.stderr)
subprocess.run(["echo", "from-a-child"])
print("four", end="")
""",
        session_id="order",
    )
    stdout = "".join(out["logs"]["stdout"])
    assert stdout.replace("from-a-child\n", "") == "one\nfour"
    assert "from-a-child\n" in stdout
    assert "".join(out["logs"]["stderr"]) == "three\n"
    assert [r["text"] for r in out["results"]] == ["'two'"]

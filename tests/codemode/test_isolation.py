"""The channel belongs to one session's kernel: no other session can see or use it, a connection
from anyone but that kernel's uid is refused, bad requests are answered and the channel keeps
serving, it goes away with its kernel, and ``--stateless`` calls get one of their own each.

In the real bubblewrap sandbox (skipped where bubblewrap cannot run)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.codemode.channel import MAX_CONNECTIONS
from kernmind.config import Settings
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rundir import socket_root
from kernmind.server import create_server
from tests.codemode.conftest import eventually, run_emitting
from tests.conftest import make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode"), pytest.mark.slow]


def sockets(settings: Settings) -> set[Path]:
    return set(socket_root(settings.workspaces_dir).rglob("tools.sock"))


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    if not Sandbox.detect("auto").isolated:
        pytest.skip("bubblewrap cannot run here: the isolation between sessions is the sandbox's")
    return make_settings(tmp_path_factory.mktemp("iso"), embedding_model="none", preload=[], pool_size=1)


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[Client]:
    async with Client(create_server(settings)) as c:
        yield c


async def ask(path: Path, *lines: bytes) -> list[dict]:
    """Send raw request lines to a channel from this (test) process; the answers (on a thread:
    the server answering runs on this event loop)."""
    return await anyio.to_thread.run_sync(_ask, path, *lines)


def _ask(path: Path, *lines: bytes) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        reader = s.makefile("rb")
        answers = []
        for line in lines:
            s.sendall(line)
            answers.append(json.loads(reader.readline()))
        return answers


async def answer_on_connect(path: Path) -> dict:
    """Connect and send nothing: what the channel says by itself (a refusal comes at once, and
    the channel closes; sending a request first would race that close)."""
    return await anyio.to_thread.run_sync(_answer_on_connect, path)


def _answer_on_connect(path: Path) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(path))
        return json.loads(s.makefile("rb").readline())


async def test_another_session_cannot_see_the_channel_and_an_outsider_is_refused(
    client: Client, settings: Settings
) -> None:
    before = sockets(settings)
    (inner,) = await run_emitting(
        client,
        "import os, kernmind_tools as km\nkm.memory_list()\nemit(os.environ['KERNMIND_TOOLS_SOCKET'])",
        session_id="a",
    )
    (a_socket,) = sockets(settings) - before
    assert inner == "/run/kernmind/tools.sock"  # inside the sandbox: its own directory, at a fixed path

    # Session b's code looks for a's socket at its host path, and finds nothing there.
    (tries,) = await run_emitting(
        client,
        f"""
import os, socket
out = []
for path in ({str(a_socket)!r}, {str(a_socket.parent)!r}):
    out.append(os.path.exists(path))
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({str(a_socket)!r})
    out.append("connected")
except OSError as e:
    out.append(type(e).__name__)
emit(out)
""",
        session_id="b",
    )
    assert tries == [False, False, "FileNotFoundError"]

    # The server's user (root here, or the server's uid) is not the kernel's uid: refused.
    answer = await answer_on_connect(a_socket)
    assert answer["ok"] is False and answer["closed"] is True and "connection refused" in answer["error"]

    # Another unprivileged uid cannot even reach it (the socket directory is the kernel uid's, 0700).
    # (The system's Python: the venv's may live where that uid cannot read, under /root.)
    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin")
    if setpriv is not None and python is not None and os.geteuid() == 0:
        probe = (
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({str(a_socket)!r}); print('connected')\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        out = await anyio.run_process(
            [setpriv, "--reuid=54321", "--regid=54321", "--clear-groups", python, "-c", probe],
            check=False,
        )
        assert out.returncode == 0, out
        assert out.stdout.decode().strip() in ("PermissionError", "FileNotFoundError"), out


async def test_bad_requests_are_answered_and_the_channel_keeps_serving(client: Client) -> None:
    (answers,) = await run_emitting(
        client,
        """
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["KERNMIND_TOOLS_SOCKET"])
r = s.makefile("rb")
out = []
for line in (b"not json\\n", b"[1, 2]\\n", b'{"op": "launch"}\\n', b'{"op": "call", "tool": "memory_list", "arguments": [1]}\\n',
             b'{"op": "call", "tool": "memory_list", "arguments": {}}\\n'):
    s.sendall(line)
    out.append(json.loads(r.readline()))
emit(out)
""",
        session_id="garbage",
    )
    assert [a["ok"] for a in answers] == [False, False, False, False, True]
    assert "not valid JSON" in answers[0]["error"]
    assert "must be a JSON object" in answers[1]["error"]
    assert "'op' must be 'describe' or 'call'" in answers[2]["error"]
    assert "given by name" in answers[3]["error"]
    assert answers[4]["result"]["total"] == structured(await client.call_tool("memory_list", {}))["total"]


async def test_the_channel_goes_with_its_session(client: Client, settings: Settings) -> None:
    before = sockets(settings)
    await run_emitting(
        client, "import kernmind_tools as km\nemit(km.memory_list()['total'])", session_id="gone"
    )
    (mine,) = sockets(settings) - before
    structured(await client.call_tool("close_session", {"session_id": "gone"}))
    assert await eventually(lambda: not mine.exists())
    with pytest.raises(OSError):
        await ask(mine, b'{"op": "describe"}\n')


async def test_stateless_calls_each_get_a_channel_and_share_the_principals_memory(tmp_path: Path) -> None:
    if not Sandbox.detect("auto").isolated:
        pytest.skip("bubblewrap cannot run here")
    settings = make_settings(tmp_path, embedding_model="none", preload=[], stateless=True)
    async with Client(create_server(settings)) as c:
        first = await run_emitting(
            c,
            "import kernmind_tools as km\nx = 1\nemit(km.archival_memory_insert(content='stateless note')['id'])",
        )
        second = await run_emitting(
            c,
            "emit('x' in globals())\nimport kernmind_tools as km\n"
            "emit([r['id'] for r in km.archival_memory_search(query='stateless note')['results']])",
        )
        assert second == [False, first]
        # A stateless call's kernel (and its channel) is dropped after it.
        assert await eventually(lambda: not sockets(settings))


async def test_a_session_may_hold_its_connections_open_and_the_next_is_told_why(client: Client) -> None:
    """The main thread (its import described the tools) and MAX_CONNECTIONS - 1 threads each hold a
    connection; one more thread is told why it was refused, and the others keep working."""
    n = MAX_CONNECTIONS
    (answers, main) = await run_emitting(
        client,
        f"""
import threading, kernmind_tools as km
out = [None] * {n}
arrived = threading.Barrier({n})
def worker(n):
    try:
        out[n] = isinstance(km.memory_list()["total"], int)
    except km.ToolError as e:
        out[n] = str(e)
    arrived.wait()
threads = []
for n in range({n}):  # one after the other: the last connects while the others hold theirs
    threads.append(threading.Thread(target=worker, args=(n,)))
    threads[-1].start()
    while out[n] is None:
        pass
for t in threads:
    t.join()
emit(out)
emit(isinstance(km.memory_list()["total"], int))
""",
        session_id="many",
    )
    assert answers[: n - 1] == [True] * (n - 1)
    assert "too many connections" in answers[n - 1] and f"at most {n} open" in answers[n - 1]
    assert main is True

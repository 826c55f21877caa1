"""Nothing a session's code sends to its code-mode channel stops the server (issue 33).

One ``kernmind serve --transport http`` with three principals (alice, bob, carol) and
``--sandbox none``, so this test process runs as the kernels' uid and may speak to alice's
channel socket directly, byte by byte. Each finding of the red-team passes is a test: a line
nested 200,000 deep (sent from inside ``run_code``, as the report did), invalid UTF-8, a frame
cut off, refusals sent to peers that already closed, a flood of connections, sixteen threads
calling at once while the import's connection is held; then a fixed-seed chaos run of a few
hundred malformed inputs in batches. After each, another principal's call from code must
succeed (before the fix, one such line left every principal with HTTP 500). Revocation
reaches code mode: a revoked principal's code-mode call is refused at once with a sentence.
``--stateless`` is covered in-process.
"""

from __future__ import annotations

import json
import os
import random
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.codemode import channel
from kernmind.server import create_server
from kernmind.tokens_file import TokenFile
from tests.codemode.conftest import run_emitting
from tests.conftest import chaos_seed, make_settings
from tests.transport.procs import HttpServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode-chaos"), pytest.mark.slow]

FAST = ("--embedding-model", "none", "--preload", "[]", "--sandbox", "none")
REQUEST_MB = 1  # --max-request-mb: an oversized request is cheap to send
DEEP = b"[" * 200000 + b"\n"
DESCRIBE = b'{"op": "describe"}\n'


class Deployment:
    def __init__(self, server: HttpServer, tokens: dict[str, str], tokens_file: Path) -> None:
        self.server = server
        self.tokens = tokens
        self.tokens_file = tokens_file

    def client(self, who: str) -> Client:
        return http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("codemode-chaos")
    file = TokenFile(tmp / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob", "carol")}
    server = start_http(
        tmp, "--tokens", str(file.path), "--pool-size", "1", "--max-request-mb", str(REQUEST_MB), *FAST
    )
    try:
        yield Deployment(server, tokens, file.path)
    finally:
        server.stop()


@pytest.fixture
async def alice(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("alice") as c:
        yield c


@pytest.fixture
async def bob(deployment: Deployment) -> AsyncIterator[Client]:
    async with deployment.client("bob") as c:
        yield c


@pytest.fixture
async def alices_channel(alice: Client) -> Path:
    """The socket of alice's session ``chaos`` (the same kernel for the whole module)."""
    (path,) = await run_emitting(
        alice, "import os\nemit(os.environ['KERNMIND_TOOLS_SOCKET'])", session_id="chaos"
    )
    return Path(path)


async def others_call_works(bob: Client, deployment: Deployment) -> None:
    """Another principal's call from code succeeds, and the server still answers HTTP."""
    assert deployment.server.proc.poll() is None, deployment.server.log_text()[-3000:]
    (total,) = await run_emitting(
        bob, "import kernmind_tools as km\nemit(km.memory_list()['total'])", session_id="bystander"
    )
    assert isinstance(total, int)


# --- a raw peer on the socket (threads: the server answers on its own event loop) ---------------
def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(str(path))
    return s


def _answers(s: socket.socket) -> list[dict[str, Any]]:
    """Every answer line until the server closes its side."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def _exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    """Send each line and read its answer on one connection (stops early once one says closed)."""
    out = []
    with _connect(path) as s:
        reader = s.makefile("rb")
        for line in lines:
            s.sendall(line)
            answer = json.loads(reader.readline())
            out.append(answer)
            if answer.get("closed"):
                break
    return out


async def exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    return await anyio.to_thread.run_sync(_exchange, path, *lines)


def still_serves(path: Path) -> None:
    """A well-formed request is answered. Connections a test just closed may still count for a
    moment (the server sees their end on its own turn): while it says there are too many, ask
    again (bounded)."""
    for _ in range(200):
        (answer,) = _exchange(path, DESCRIBE)
        if "too many connections" not in str(answer.get("error")):
            break
        time.sleep(0.05)
    assert answer["ok"] and answer["tools"], answer


# --- the findings -------------------------------------------------------------------------------
async def test_a_line_nested_200000_deep_from_run_code_is_answered_and_nothing_stops(
    alice: Client, bob: Client, deployment: Deployment
) -> None:
    """The report's line, from inside run_code: answered in words; the same connection and the
    module keep working, and so does another principal's code."""
    (answer, after) = await run_emitting(
        alice,
        """
import json, os, socket
import kernmind_tools as km
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["KERNMIND_TOOLS_SOCKET"])
s.sendall(b"[" * 200000 + b"\\n")
reader = s.makefile("rb")
emit(json.loads(reader.readline()))
emit(isinstance(km.memory_list()["total"], int))
""",
        session_id="deep",
    )
    assert answer["ok"] is False and "nested too deeply" in answer["error"], answer
    assert after is True
    await others_call_works(bob, deployment)


async def test_invalid_utf8_and_non_objects_are_answered_and_the_connection_serves_on(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    answers = await exchange(
        alices_channel, b'{"op": "describe", "x": "\xff\xfe"}\n', b"[1, 2]\n", b"not json\n", DESCRIBE
    )
    assert "not valid UTF-8" in answers[0]["error"]
    assert "must be a JSON object" in answers[1]["error"]
    assert "not valid JSON" in answers[2]["error"]
    assert answers[3]["ok"] is True  # the same connection, still serving
    await others_call_works(bob, deployment)


async def test_a_truncated_frame_is_answered_while_the_peer_still_reads(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    def truncated() -> list[dict[str, Any]]:
        with _connect(alices_channel) as s:
            s.sendall(b'{"op": "call", "tool": "memory_li')
            s.shutdown(socket.SHUT_WR)
            return _answers(s)

    (answer,) = await anyio.to_thread.run_sync(truncated)
    assert answer["ok"] is False and answer["closed"] is True
    assert "ended before its end of line" in answer["error"]
    await anyio.to_thread.run_sync(still_serves, alices_channel)
    await others_call_works(bob, deployment)


async def test_refusals_sent_to_peers_that_already_closed_stop_nothing(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    """Hold every connection the channel allows, then open six more that shut their reading side
    and close: the refusal meets a closed peer. Then an oversized request whose sender is gone."""

    def hold_and_knock() -> None:
        held = [_connect(alices_channel) for _ in range(channel.MAX_CONNECTIONS)]
        try:
            for s in held[:3]:  # each held connection is really being served
                s.sendall(DESCRIBE)
                assert json.loads(s.makefile("rb").readline())["ok"]
            for _ in range(6):
                extra = _connect(alices_channel)
                extra.shutdown(socket.SHUT_RD)
                extra.close()
            big = _connect(alices_channel)
            big.shutdown(socket.SHUT_RD)
            # No room for it: told to go away, or its oversized request is refused unread (either way,
            # the answer meets a peer that is gone).
            try:
                big.sendall(b"x" * (REQUEST_MB * 1024 * 1024 + 65536))
            except OSError:
                pass
            big.close()
        finally:
            for s in held:
                s.close()

    await anyio.to_thread.run_sync(hold_and_knock)

    def oversized_then_gone() -> None:
        s = _connect(alices_channel)
        try:
            s.sendall(b"y" * (REQUEST_MB * 1024 * 1024 + 65536))
        except OSError:
            pass
        s.close()

    await anyio.to_thread.run_sync(oversized_then_gone)
    await anyio.to_thread.run_sync(still_serves, alices_channel)
    await others_call_works(bob, deployment)


async def test_a_flood_of_connections_stops_nothing(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    def flood() -> tuple[int, int]:
        opened = [_connect(alices_channel) for _ in range(channel.MAX_CONNECTIONS * 3)]
        served = refused = 0
        for s in opened:
            try:
                s.sendall(DESCRIBE)
                line = s.makefile("rb").readline()
            except OSError:
                line = b""
            if not line:
                continue  # past the cap and past the few told why: simply closed
            answer = json.loads(line)
            if answer["ok"]:
                served += 1
            else:
                assert "too many connections" in answer["error"], answer
                refused += 1
        for s in opened:
            s.close()
        return served, refused

    served, refused = await anyio.to_thread.run_sync(flood)
    # (connections of the tests before may still count for a moment: at most the cap is served)
    assert 0 < served <= channel.MAX_CONNECTIONS and refused <= channel.ENOUGH
    await anyio.to_thread.run_sync(still_serves, alices_channel)
    await others_call_works(bob, deployment)


async def test_sixteen_threads_in_a_hot_loop_see_no_refusal(alice: Client) -> None:
    """The main thread's connection (held since the import) costs no turn: sixteen threads
    calling as fast as they can, all at once, are all served."""
    (outcomes,) = await run_emitting(
        alice,
        """
import threading, kernmind_tools as km
km.memory_list()
errors, done = [], []
start = threading.Barrier(16)
def worker():
    start.wait()
    for _ in range(15):
        try:
            km.memory_list()
            done.append(1)
        except km.ToolError as e:
            errors.append(str(e))
threads = [threading.Thread(target=worker) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
emit({"done": len(done), "errors": errors[:3]})
""",
        session_id="threads",
    )
    assert outcomes == {"done": 16 * 15, "errors": []}


async def test_chaos_on_the_code_mode_socket(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    """A few hundred malformed inputs of every kind, from a fixed seed, in batches; after each
    batch the channel still answers a well-formed request and bob's code still calls tools."""
    rng = random.Random(chaos_seed(33))
    batches = [[_chaos_input(rng) for _ in range(30)] for _ in range(10)]
    for batch in batches:
        for kind, payload, how in batch:
            answers = await anyio.to_thread.run_sync(_deliver, alices_channel, payload, how)
            for answer in answers:
                assert answer["ok"] is False and isinstance(answer["error"], str), (kind, answer)
                assert len(answer["error"]) > 20, (kind, answer)
        await anyio.to_thread.run_sync(still_serves, alices_channel)
        await others_call_works(bob, deployment)


def _chaos_input(rng: random.Random) -> tuple[str, bytes, str]:
    """(kind, bytes, how they are delivered): ``read`` the answers, ``shut`` the writing side
    first, ``drop`` (close at once, reading nothing) or ``deaf`` (shut the reading side first)."""
    kind = rng.choice(
        ["deep", "deep-object", "utf8", "garbage", "non-object", "bad-call", "deep-arguments", "truncated",
         "oversize", "many-lines", "empty-lines"]
    )  # fmt: skip
    how = rng.choice(["read", "read", "read", "drop", "deaf"])
    if kind == "deep":
        payload = b"[" * rng.randint(1000, 300000) + b"\n"
    elif kind == "deep-object":
        payload = b'{"op": ' * rng.randint(1000, 100000) + b"\n"
    elif kind == "utf8":
        payload = (
            b'{"op": "describe", "x": "'
            + bytes(rng.choice([0xFF, 0xC0, 0x80, 0xED]) for _ in range(5))
            + b'"}\n'
        )
    elif kind == "garbage":
        payload = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))).replace(b"\n", b"") + b"\n"
    elif kind == "non-object":
        payload = rng.choice([b"[]", b"42", b'"call"', b"null", b"true", b"1e999", b"NaN", b"-"]) + b"\n"
    elif kind == "bad-call":
        payload = (
            rng.choice(
                [
                    b'{"op": "call"}',
                    b'{"op": "call", "tool": 7}',
                    b'{"op": "call", "tool": "run_code", "arguments": {"code": "1"}}',
                    b'{"op": "call", "tool": "memory_read", "arguments": [1, 2]}',
                    b'{"op": "call", "tool": "memory_read", "arguments": {"label": null, "x": NaN}}',
                    b'{"op": "call", "tool": "memory_read", "arguments": {"label": "\\ud800"}}',
                    b'{"op": "nope"}',
                    b"{}",
                ]
            )
            + b"\n"
        )
    elif kind == "deep-arguments":
        depth = rng.randint(100, 990)
        payload = (
            b'{"op": "call", "tool": "archival_memory_insert", "arguments": {"content": "x", "tags": '
            + b"[" * depth
            + b"]" * depth
            + b"}}\n"
        )
    elif kind == "truncated":
        payload = b'{"op": "call", "tool": "memory_read", "arguments": {"label": "hu'[: rng.randint(1, 60)]
        how = rng.choice(["shut", "drop"])
    elif kind == "oversize":
        payload = b"z" * (REQUEST_MB * 1024 * 1024 + rng.randint(1, 200000))
    elif kind == "many-lines":
        payload = b"".join(rng.choice([b"[]\n", b"{\n", b"\xff\n", b'{"op": 1}\n']) for _ in range(20))
    else:
        payload = b"\n" * rng.randint(1, 5)
    return kind, payload, how


def _deliver(path: Path, payload: bytes, how: str) -> list[dict[str, Any]]:
    with _connect(path) as s:
        try:
            if how == "deaf":
                s.shutdown(socket.SHUT_RD)
            s.sendall(payload)
            if how in ("drop", "deaf"):
                return []
            s.shutdown(socket.SHUT_WR)  # "read" and "shut": the server sees the end, answers, closes
        except OSError:
            return []  # refused part-way (an oversized request): the server closed its side
        try:
            return _answers(s)
        except ConnectionResetError:
            return []


async def test_a_server_short_of_descriptors_keeps_its_listener(
    alices_channel: Path, bob: Client, deployment: Deployment
) -> None:
    """The server's descriptor limit is lowered to what it has open, and a flood of connections
    arrives: accepting fails (EMFILE) and the channel waits and accepts again, instead of leaving
    its listener (before: the error left listener.serve and stopped the server). Once the limit
    is back, the connections that waited are served, and so is bob."""
    pid = deployment.server.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
    opened: list[socket.socket] = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (highest + 1, before[1]))
        opened = [_connect(alices_channel) for _ in range(100)]
        for s in opened:
            s.sendall(DESCRIBE)
        short = "cannot accept a connection now"
        for _ in range(600):  # until the server says it is short of descriptors (bounded)
            if short in deployment.server.log_text():
                break
            await anyio.sleep(0.05)
        assert short in deployment.server.log_text()
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)

    def answered() -> list[dict[str, Any]]:
        out = []
        for s in opened[:10]:  # the first ten waited in the backlog: now served
            out.append(json.loads(s.makefile("rb").readline()))
        return out

    assert all(a["ok"] for a in await anyio.to_thread.run_sync(answered))
    for s in opened:
        s.close()
    await anyio.to_thread.run_sync(still_serves, alices_channel)
    await others_call_works(bob, deployment)


# --- revocation -------------------------------------------------------------------------------
async def test_a_revoked_principals_code_mode_call_is_refused_at_once(deployment: Deployment) -> None:
    """carol's code holds a connection; her token is revoked; the very next call on it is refused
    with a sentence (her running code is ended by the revocation watch soon after; this call comes
    first: it is sent the moment the tokens file is written)."""
    async with deployment.client("carol") as carol:
        (path,) = await run_emitting(
            carol,
            "import os, kernmind_tools as km\nkm.memory_list()\nemit(os.environ['KERNMIND_TOOLS_SOCKET'])",
            session_id="revoked",
        )

    def revoke_then_call() -> tuple[dict[str, Any], dict[str, Any]]:
        with _connect(Path(path)) as s:
            reader = s.makefile("rb")
            s.sendall(b'{"op": "call", "tool": "memory_list", "arguments": {}}\n')
            before = json.loads(reader.readline())
            TokenFile(deployment.tokens_file).revoke("carol")
            s.sendall(b'{"op": "call", "tool": "memory_list", "arguments": {}}\n')
            return before, json.loads(reader.readline())

    before, after = await anyio.to_thread.run_sync(revoke_then_call)
    assert before["ok"] is True
    assert after["ok"] is False and "revoked" in after["error"] and "carol" in after["error"], after


# --- --stateless ------------------------------------------------------------------------------
async def test_stateless_the_deep_line_stops_nothing(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, embedding_model="none", preload=[], stateless=True, sandbox="none")
    async with Client(create_server(settings)) as c:
        (answer,) = await run_emitting(
            c,
            """
import json, os, socket
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["KERNMIND_TOOLS_SOCKET"])
s.sendall(b"[" * 200000 + b"\\n")
emit(json.loads(s.makefile("rb").readline()))
""",
        )
        assert "nested too deeply" in answer["error"]
        (total,) = await run_emitting(c, "import kernmind_tools as km\nemit(km.memory_list()['total'])")
        assert isinstance(total, int)

"""Chaos on the listeners: a few hundred malformed inputs, a fixed seed (another:
``KERNMIND_TEST_CHAOS_SEED``), and after each batch another principal's well-formed call still
succeeds.

HTTP (one real ``kernmind serve --transport http --tokens FILE`` process, principals alice
and bob): alice's side sends, in batches, over raw loopback sockets and in both protocol eras
(the 2025-11-25 handshake with ``Mcp-Session-Id``, and 2026-07-28 sessionless requests):
JSON nested 200,000 deep, bodies past ``--max-request-mb`` (declared and streamed), bodies cut
short, invalid UTF-8 in bodies and headers, wrong content types, JSON-RPC of the wrong shape,
garbage that is not HTTP, peers that close early, half-close or reset, other principals'
session ids, and ``run_code`` calls whose client disconnects while the code runs. Every case
that waits for an answer gets one below 500, in words where it is JSON-RPC, and none hangs;
after each batch bob's call succeeds over the SDK's client (the eras take turns); a flood of
loopback connections held open does not keep bob out.

stdio (one real ``kernmind serve`` on pipes): batches of garbage lines on stdin, each answered
with exactly one JSON-RPC error (its own id where it has one), then a proper call succeeds and
the server is still running. A client that closes the server's stdout stops it in order.

Every loop is bounded; nothing leaves loopback. Before the fixes in this change, the stdio
batches failed (unreadable lines were dropped without an answer, the client waited forever)
and a closed stdout ended the server with a traceback and exit code 1.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import resource
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernmind.tokens_file import TokenFile
from kernmind.transport.session_cap import PER_PRINCIPAL
from tests.conftest import chaos_seed, structured
from tests.transport import procs
from tests.transport.procs import (
    HttpServer,
    StdioServer,
    descendants,
    http_client,
    mentioning,
    start_http,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("chaos"), pytest.mark.slow]

SEED = 20261128
LEGACY, MODERN = "2025-11-25", "2026-07-28"
MIB = 1024 * 1024
LIMIT_MB = 1
BATCHES, PER_BATCH = 12, 25  # 300 HTTP cases
STDIO_BATCHES, STDIO_PER_BATCH = 8, 25  # 200 stdio lines
READ_TIMEOUT = 30.0  # a case that waits this long for an answer has hung: a failure
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "chaos", "version": "0"},
}


# --- raw HTTP over loopback -------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Target:
    port: int
    tokens: dict[str, str]
    legacy_sid: str = ""

    def request(
        self,
        body: bytes,
        *,
        era: str = "modern",
        method: str = "POST",
        mcp_method: str = "tools/list",
        headers: dict[str, bytes | str | None] | None = None,
        length: int | None = None,
        who: str = "alice",
    ) -> bytes:
        """An HTTP/1.1 request as bytes (``headers`` override; a None value leaves one out)."""
        base: dict[str, bytes | str | None] = {
            "Host": f"127.0.0.1:{self.port}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.tokens[who]}",
            "Connection": "close",
        }
        if era == "legacy":
            base |= {"MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": self.legacy_sid}
        else:
            base |= {"MCP-Protocol-Version": MODERN, "Mcp-Method": mcp_method}
        if method == "POST":
            base["Content-Length"] = str(len(body) if length is None else length)
        base |= headers or {}
        lines = [f"{method} /mcp HTTP/1.1".encode()]
        for key, value in base.items():
            if value is not None:
                lines.append(key.encode() + b": " + (value if isinstance(value, bytes) else value.encode()))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def exchange(self, data: bytes, then: str = "read") -> Reply | None:
        """Send ``data``; then read the answer (``read``), half-close and read (``shut``), close
        at once (``close``) or reset (``rst``). None: no answer (the server closed)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=READ_TIMEOUT) as sock:
            try:
                sock.sendall(data)
            except OSError:  # the server refused the rest (a 413 sent early closes the connection)
                pass
            if then == "close":
                return None
            if then == "rst":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return None
            if then == "shut":
                sock.shutdown(socket.SHUT_WR)
            return read_reply(sock)


def read_reply(sock: socket.socket) -> Reply | None:
    raw = b""
    deadline = time.monotonic() + 2 * READ_TIMEOUT  # (an event stream's pings would keep recv busy)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        except TimeoutError as exc:
            raise AssertionError(f"no answer within {READ_TIMEOUT} s: {raw[:300]!r}") from exc
        if not chunk:
            break
        raw += chunk
        if time.monotonic() > deadline:
            raise AssertionError(f"the answer did not end within {2 * READ_TIMEOUT:g} s: {raw[:300]!r}")
    if not raw:
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Reply(int(lines[0].split()[1]), headers, body)


def envelope(method: str, params: dict[str, Any] | None = None, *, era: str, rid: Any = 1) -> dict[str, Any]:
    params = dict(params or {})
    if era == "modern":
        params["_meta"] = MODERN_META
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def body_of(message: Any) -> bytes:
    return json.dumps(message).encode()


# --- the cases ----------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    run: Callable[[], Reply | None]
    expect: str  # "answer": a status below 500; "either": that, or the server closes; "none": not read
    words: bool = True  # a 4xx must carry a JSON-RPC error with a sentence


@dataclass
class Chaos:
    target: Target
    rng: random.Random
    data_dir: Path
    cases_run: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def one(self) -> Case:
        kind = self.rng.choice(
            [
                "deep",
                "oversize",
                "truncated",
                "utf8",
                "content_type",
                "shape",
                "peer",
                "garbage",
                "session",
                "auth",
            ]
        )
        era = self.rng.choice(["legacy", "modern"])
        return getattr(self, f"case_{kind}")(era)

    def send(self, data: bytes, then: str = "read") -> Callable[[], Reply | None]:
        return lambda: self.target.exchange(data, then)

    # Each case_* returns a Case; every choice comes from the seeded generator.
    def case_deep(self, era: str) -> Case:
        depth = self.rng.choice([1_000, 20_000, 200_000])
        opener, closer = self.rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        inner = opener * depth + (closer * depth if self.rng.random() < 0.5 else b"")
        if self.rng.random() < 0.5:  # inside a well-formed envelope
            head = body_of(envelope("tools/list", era=era))[:-2]  # without the closing "}}"
            body = head + b', "x": ' + inner + b"}}"
        else:
            body = inner
        return Case(f"deep-{depth}-{era}", self.send(self.target.request(body, era=era)), "answer")

    def case_oversize(self, era: str) -> Case:
        size = self.rng.choice([LIMIT_MB * MIB + 1, 3 * MIB])
        call = envelope(
            "tools/call", {"name": "upload_file", "arguments": {"path": "x", "content": ""}}, era=era
        )
        head = body_of(call).replace(b'"content": ""', b'"content": "')
        body = head + b"a" * (size - len(head))
        how = self.rng.choice(["declared", "declared-close", "streamed", "streamed-rst"])
        if how.startswith("declared"):  # the length says it all; the body is cut off
            data = self.target.request(body[:4096], era=era, length=size, mcp_method="tools/call")
            then = "read" if how == "declared" else "close"
        else:  # chunked: only the bytes tell
            chunks = b"".join(
                b"%x\r\n%s\r\n" % (len(c), c) for c in (body[i : i + MIB] for i in range(0, size, MIB))
            )
            extra: dict[str, bytes | str | None] = {"Content-Length": None, "Transfer-Encoding": "chunked"}
            data = self.target.request(chunks + b"0\r\n\r\n", era=era, headers=extra, mcp_method="tools/call")
            then = "read" if how == "streamed" else "rst"
        return Case(f"oversize-{how}-{era}", self.send(data, then), "answer" if then == "read" else "none")

    def case_truncated(self, era: str) -> Case:
        body = body_of(envelope("tools/call", {"name": "list_sessions", "arguments": {}}, era=era))
        cut = self.rng.randrange(1, len(body))
        then = self.rng.choice(["close", "shut", "rst"])
        data = self.target.request(body[:cut], era=era, length=len(body), mcp_method="tools/call")
        return Case(f"truncated-{then}-{era}", self.send(data, then), "either" if then == "shut" else "none")

    def case_utf8(self, era: str) -> Case:
        bad = self.rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
        where = self.rng.choice(["body", "string", "session-header", "version-header", "method-header"])
        body = body_of(envelope("tools/list", era=era))
        headers: dict[str, bytes | str | None] = {}
        if where == "body":
            pos = self.rng.randrange(len(body))
            body = body[:pos] + bad + body[pos:]
        elif where == "string":
            body = body.replace(b'"tools/list"', b'"tools/' + bad + b'list"')
        elif where == "session-header":
            headers["Mcp-Session-Id"] = b"abc" + bad
        elif where == "version-header":
            headers["MCP-Protocol-Version"] = b"2025" + bad
        else:
            headers["Mcp-Method"] = b"tools/" + bad
        return Case(
            f"utf8-{where}-{era}", self.send(self.target.request(body, era=era, headers=headers)), "answer"
        )

    def case_content_type(self, era: str) -> Case:
        kind = self.rng.choice(
            [
                None,
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/jsonx",
                "APPLICATION/JSON",
                "application/json; charset=latin-1",
                "\xe9/json",
            ]
        )
        body = body_of(envelope("tools/list", era=era))
        value = kind.encode("latin-1") if kind is not None else None
        data = self.target.request(body, era=era, headers={"Content-Type": value})
        return Case(f"content-type-{kind}-{era}", self.send(data), "answer")

    def case_shape(self, era: str) -> Case:
        good = envelope("tools/call", {"name": "run_code", "arguments": {"code": "1"}}, era=era)
        shapes: list[Any] = [
            [good, good],
            [],
            {},
            None,
            42,
            "text",
            {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
            {**good, "id": {"a": 1}},
            {**good, "id": [1]},
            {**good, "id": True},
            {**good, "id": 1.5},
            {**good, "id": None},
            {**good, "method": 7},
            {**good, "params": [1, 2]},
            {**good, "params": "x"},
            {"jsonrpc": "2.0", "id": 1},
            {"jsonrpc": "2.0", "result": {}, "id": 99},
            {**good, "method": "tools/nope"},
            {**good, "params": {**good["params"], "name": ["run_code"]}},
            {**good, "params": {**good["params"], "arguments": "code"}},
            {**good, "params": {**good["params"], "arguments": {"code": 1, "timeout": "soon"}}},
            {**good, "id": "x" * 5000},
            {**good, "id": 10**30},
        ]
        shape = self.rng.choice(shapes)
        raw = self.rng.choice([body_of(shape), body_of(shape).replace(b"1.5", b"NaN")])
        method = (
            good["method"]
            if isinstance(shape, dict) and isinstance(shape.get("method"), str)
            else "tools/call"
        )
        return Case(
            f"shape-{json.dumps(shape)[:40]}-{era}",
            self.send(self.target.request(raw, era=era, mcp_method=method)),
            "answer",
        )

    def case_peer(self, era: str) -> Case:
        body = body_of(envelope("tools/call", {"name": "list_sessions", "arguments": {}}, era=era))
        then = self.rng.choice(["close", "shut", "rst"])
        data = self.target.request(body, era=era, mcp_method="tools/call")
        return Case(f"peer-{then}-{era}", self.send(data, then), "either" if then == "shut" else "none")

    def case_garbage(self, era: str) -> Case:
        data = self.rng.choice(
            [
                bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 600))),
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello
                b"GET /mcp HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n",
                b"POST /mcp HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                b"POST /mcp HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"POST /mcp HTTP/9.9\r\n\r\n",
                b"\r\n" * 500,
            ]
        )
        return Case(f"garbage-{data[:12]!r}", self.send(data, "shut"), "either", words=False)

    def case_session(self, era: str) -> Case:
        what = self.rng.choice(["other-post", "other-delete", "unknown", "get-dropped", "huge-id"])
        body = body_of(envelope("tools/list", era="legacy"))
        if what == "other-post":  # bob presents alice's session
            data = self.target.request(body, era="legacy", who="bob")
        elif what == "other-delete":
            data = self.target.request(b"", era="legacy", method="DELETE", who="bob")
        elif what == "unknown":
            data = self.target.request(
                body, era="legacy", headers={"Mcp-Session-Id": f"{self.rng.getrandbits(128):032x}"}
            )
        elif what == "huge-id":
            data = self.target.request(body, era="legacy", headers={"Mcp-Session-Id": "a" * 8000})
        else:  # an event stream opened on alice's session and dropped at once
            headers: dict[str, bytes | str | None] = {"Accept": "text/event-stream", "Content-Type": None}
            data = self.target.request(b"", era="legacy", method="GET", headers=headers)
            return Case("session-get-dropped", self.send(data, "close"), "none")
        return Case(f"session-{what}", self.send(data), "answer")

    def case_auth(self, era: str) -> Case:
        value = self.rng.choice(
            [None, b"", b"Bearer", b"Bearer \xff\xfe", b"Basic abc", b"Bearer " + b"k" * 60_000]
        )
        data = self.target.request(
            body_of(envelope("tools/list", era=era)), era=era, headers={"Authorization": value}
        )
        return Case(f"auth-{(value or b'none')[:16]!r}-{era}", self.send(data), "answer")


def check(case: Case, reply: Reply | None) -> str | None:
    """Why this outcome is wrong (None: fine)."""
    if case.expect == "none":
        return None
    if reply is None:
        return None if case.expect == "either" else "the server closed without an answer"
    if reply.status >= 500:
        return f"status {reply.status}: {reply.body[:300]!r}"
    if case.words and reply.status >= 400 and reply.status != 401:
        try:
            error = json.loads(reply.body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {reply.status} without a JSON-RPC error: {reply.body[:300]!r}"
        if len(str(error.get("message", ""))) < 12:
            return f"status {reply.status}: an error without words: {error}"
    return None


def run_batch(chaos: Chaos, cases: list[Case]) -> list[str]:
    failures = []

    def one(case: Case) -> str | None:
        try:
            reply = case.run()
        except AssertionError as exc:
            return f"{case.name}: {exc}"
        except OSError as exc:
            if case.expect == "answer":
                return f"{case.name}: {exc!r}"
            return None
        if reply is not None:
            chaos.statuses[reply.status] = chaos.statuses.get(reply.status, 0) + 1
        problem = check(case, reply)
        return None if problem is None else f"{case.name}: {problem}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        for problem in pool.map(one, cases):
            if problem is not None:
                failures.append(problem)
    chaos.cases_run += len(cases)
    return failures


# --- the HTTP deployment ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, Target]]:
    tmp = tmp_path_factory.mktemp("chaos")
    file = TokenFile(tmp / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    server = start_http(
        tmp,
        *("--tokens", str(tmp / "tokens.json"), "--sandbox", "none", "--embedding-model", "none"),
        *("--max-request-mb", str(LIMIT_MB)),
    )
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    target = Target(port, tokens)
    init = envelope(
        "initialize",
        {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "chaos", "version": "0"}},
        era="legacy",
    )
    reply = target.exchange(target.request(body_of(init), era="legacy", headers={"Mcp-Session-Id": None}))
    assert reply is not None and reply.status == 200, reply
    target.legacy_sid = reply.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    reply = target.exchange(target.request(body_of(note), era="legacy"))
    assert reply is not None and reply.status == 202, reply
    try:
        yield server, target
    finally:
        if server.proc.poll() is None:
            server.stop()


async def bob_calls(server: HttpServer, target: Target, mode: str, code: str = "6 * 7") -> None:
    """bob's well-formed call over the SDK's client succeeds."""
    assert server.proc.poll() is None, server.log_text()[-3000:]
    with anyio.fail_after(60):
        async with http_client(server.url, {"Authorization": f"Bearer {target.tokens['bob']}"}, mode) as bob:
            out = structured(await bob.call_tool("run_code", {"code": code, "session_id": "bob"}))
            assert out["results"][0]["text"] == "42", out


def long_call(target: Target, era: str, session: str, marker: Path, then: str) -> Reply | None:
    """Start a run_code call that runs for a while, and drop the connection once it runs."""
    code = f"open({str(marker)!r}, 'w').close()\nimport time\ntime.sleep(1)\n7"
    call = envelope(
        "tools/call", {"name": "run_code", "arguments": {"code": code, "session_id": session}}, era=era
    )
    data = target.request(body_of(call), era=era, mcp_method="tools/call", headers={"Mcp-Name": "run_code"})
    with socket.create_connection(("127.0.0.1", target.port), timeout=READ_TIMEOUT) as sock:
        sock.sendall(data)
        assert wait_until(marker.exists, 60), "the call did not start"
        if then == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return None
        if then == "shut":
            sock.shutdown(socket.SHUT_WR)
            return read_reply(sock)
        return None


async def test_http_chaos_in_both_eras_stops_no_one(deployment: tuple[HttpServer, Target]) -> None:
    server, target = deployment
    rng = random.Random(chaos_seed(SEED))
    chaos = Chaos(target, rng, server.data_dir)
    t0 = time.monotonic()
    for batch in range(BATCHES):
        cases = [chaos.one() for _ in range(PER_BATCH)]
        failures = run_batch(chaos, cases)
        assert not failures, f"batch {batch}:\n" + "\n".join(failures)
        await bob_calls(server, target, "legacy" if batch % 2 else "auto")

    # Clients that disconnect while their run_code call runs, in both eras.
    workspace = server.data_dir / "sessions" / "alice"
    for i, (era, then) in enumerate(
        [("legacy", "close"), ("modern", "close"), ("legacy", "rst"), ("modern", "shut")]
    ):
        session = f"long{i}"
        marker = workspace / session / "files" / "started"
        await anyio.to_thread.run_sync(long_call, target, era, session, marker, then)
        await bob_calls(server, target, "auto")
        # alice's session is not stuck: her next call in it answers (after the cut one ends)
        with anyio.fail_after(60):
            async with http_client(
                server.url, {"Authorization": f"Bearer {target.tokens['alice']}"}, "auto"
            ) as alice:
                out = structured(await alice.call_tool("run_code", {"code": "6 * 7", "session_id": session}))
                assert out["results"][0]["text"] == "42", out

    # A flood of loopback connections, held open while bob calls, then dropped.
    held: list[socket.socket] = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=READ_TIMEOUT)
            held.append(sock)
            part = [b"", b"POST /mcp HTTP/1.1\r\nHost: x\r\n", target.request(b'{"jsonrpc":', length=4000)][
                i % 3
            ]
            if part:
                sock.sendall(part)
        await bob_calls(server, target, "legacy")
        await bob_calls(server, target, "auto")
    finally:
        for i, sock in enumerate(held):
            if i % 2:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
    await bob_calls(server, target, "auto")
    # alice's own handshake-era session still answers after all of it
    listed = target.exchange(
        target.request(body_of(envelope("tools/list", era="legacy", rid=5)), era="legacy")
    )
    assert listed is not None and listed.status == 200 and b'"run_code"' in listed.body, listed
    elapsed = time.monotonic() - t0
    print(f"{chaos.cases_run} HTTP cases in {elapsed:.1f} s; statuses {sorted(chaos.statuses.items())}")
    log = server.log_text()
    for crash in ("Task group is not initialized", "Exception in ASGI application", "internal error (ref"):
        assert crash not in log, log[log.index(crash) - 2000 : log.index(crash) + 2000]


def test_a_request_id_still_being_answered_in_the_session_is_refused_not_lost(
    deployment: tuple[HttpServer, Target],
) -> None:
    """Two requests with one id at once in one session: the SDK keys a session's answers by id, so
    one of them used to wait for ever on an open event stream (the chaos run's 6 threads share
    alice's session and id 1). Now the second is refused in words, the first is answered, and the
    id is free again once it is."""
    _, target = deployment
    marker = target_dir(deployment) / "same-id" / "files" / "started"
    code = f"open({str(marker)!r}, 'w').close()\nimport time\ntime.sleep(2)\n7"
    first = envelope(
        "tools/call",
        {"name": "run_code", "arguments": {"code": code, "session_id": "same-id"}},
        era="legacy",
        rid=77,
    )
    again = envelope("tools/list", era="legacy", rid="77")  # the same id to the SDK
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(
            target.exchange, target.request(body_of(first), era="legacy", mcp_method="tools/call")
        )
        assert wait_until(marker.exists, 60), "the first call did not start"
        refused = target.exchange(target.request(body_of(again), era="legacy"))
        reply = answer.result(timeout=2 * READ_TIMEOUT)
    assert refused is not None and refused.status == 409, refused
    error = json.loads(refused.body)["error"]
    assert error["message"].startswith('A request with the id "77" is still being answered'), error
    assert reply is not None and reply.status == 200 and b'"text":"7"' in reply.body.replace(b" ", b""), reply
    listed = target.exchange(target.request(body_of(again), era="legacy"))
    assert listed is not None and listed.status == 200 and b'"run_code"' in listed.body, listed


def target_dir(deployment: tuple[HttpServer, Target]) -> Path:
    """alice's sessions' directory."""
    return deployment[0].data_dir / "sessions" / "alice"


async def test_a_flood_of_handshakes_takes_no_one_elses_sessions(
    deployment: tuple[HttpServer, Target],
) -> None:
    """alice opening session after session (2025-11-25 initialize) is refused past her share;
    bob's handshake still works; a session alice closes makes room for one more."""
    server, target = deployment
    init = envelope(
        "initialize",
        {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}},
        era="legacy",
    )
    opening = target.request(body_of(init), era="legacy", headers={"Mcp-Session-Id": None})
    opened: list[str] = []

    def open_until_refused() -> Reply:
        for _ in range(PER_PRINCIPAL + 5):  # bounded: past the cap
            reply = target.exchange(opening)
            assert reply is not None
            if reply.status != 200:
                return reply
            opened.append(reply.headers["mcp-session-id"])
        raise AssertionError(f"{len(opened)} sessions opened and none refused")

    def delete(sid: str) -> int:
        reply = target.exchange(
            target.request(b"", era="legacy", method="DELETE", headers={"Mcp-Session-Id": sid})
        )
        assert reply is not None
        return reply.status

    try:
        refused = await anyio.to_thread.run_sync(open_until_refused)
        assert refused.status == 429, refused
        message = json.loads(refused.body)["error"]["message"]
        assert f"already has {PER_PRINCIPAL} MCP sessions open" in message and "Nothing was done" in message
        await bob_calls(server, target, "legacy")  # another principal's handshake is not refused
        await bob_calls(server, target, "auto")
        assert await anyio.to_thread.run_sync(delete, opened.pop()) == 200
        again = await anyio.to_thread.run_sync(target.exchange, opening)
        assert again is not None and again.status == 200, again
        opened.append(again.headers["mcp-session-id"])
    finally:
        for sid in opened:
            await anyio.to_thread.run_sync(delete, sid)


async def test_a_flood_past_the_soft_open_files_limit_keeps_no_one_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with a soft limit of 256 open files (as a shell's default of 1,024 is,
    for a bigger flood): 400 loopback connections held open by one client do not keep another
    principal's calls out (before, every accept failed with EMFILE until they closed)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard open-files limit here is {hard}")
    wrapped = procs.serve_argv
    monkeypatch.setattr(
        procs, "serve_argv", lambda *a: ["prlimit", f"--nofile=256:{min(hard, 4096)}", "--", *wrapped(*a)]
    )
    file = TokenFile(tmp_path / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    server = await anyio.to_thread.run_sync(
        lambda: start_http(
            tmp_path,
            "--tokens",
            str(tmp_path / "tokens.json"),
            "--sandbox",
            "none",
            "--embedding-model",
            "none",
        )
    )
    target = Target(int(server.url.rsplit(":", 1)[1].split("/")[0]), tokens)
    held: list[socket.socket] = []
    try:
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=READ_TIMEOUT)
            held.append(sock)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")  # and never more
        await bob_calls(server, target, "auto")
        await bob_calls(server, target, "legacy")
    finally:
        for sock in held:
            sock.close()
        server.stop()
    assert "Too many open files" not in server.log_text()


# --- stdio ----------------------------------------------------------------------------------------
def stdio_garbage(rng: random.Random, rid: int) -> tuple[bytes, int | None]:
    """A line the server must answer with one error: (the line, the id the answer carries)."""
    kind = rng.choice(["deep", "utf8", "json", "shape", "id", "batch", "oversize", "binary"])
    good = {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}
    if kind == "deep":
        return rng.choice([b"[", b'{"a":']) * rng.choice([1_000, 200_000]), None
    if kind == "utf8":
        line = json.dumps(good).encode()
        pos = rng.randrange(len(line))
        return line[:pos] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"]) + line[pos:], None
    if kind == "json":
        line = json.dumps(good).encode()
        return line[: rng.randrange(1, len(line) - 1)], None
    if kind == "shape":  # readable JSON whose id is fine but whose shape is not
        bad = rng.choice([{"params": [1]}, {"params": "x"}, {"jsonrpc": "1.0"}, {"method": 5}])
        return json.dumps({**good, **bad}).encode(), rid
    if kind == "id":
        return json.dumps({**good, "id": rng.choice([{"a": 1}, [1], True, 1.5, None])}).encode(), None
    if kind == "batch":
        return json.dumps([good, good]).encode(), None
    if kind == "oversize":  # past --max-request-mb: answered with the id read from its head
        return json.dumps(good).encode()[:-1] + b', "x": "' + b"a" * (LIMIT_MB * MIB + 10) + b'"}', rid
    return bytes(rng.choice([0, 1, 2, 0x7F, 0xFE]) for _ in range(rng.randrange(1, 50))) + b"x", None


async def test_stdio_garbage_is_answered_and_stops_nothing(tmp_path: Path) -> None:
    server = await anyio.to_thread.run_sync(
        lambda: StdioServer.start(
            tmp_path, "--sandbox", "none", "--embedding-model", "none", "--max-request-mb", str(LIMIT_MB)
        )
    )
    rng = random.Random(chaos_seed(SEED))
    next_id = 10_000
    try:
        for batch in range(STDIO_BATCHES):
            expected_ids: list[int] = []
            nulls = 0
            assert server.proc.stdin is not None
            for _ in range(STDIO_PER_BATCH):
                line, rid = stdio_garbage(rng, next_id)
                next_id += 1
                if rid is None:
                    nulls += 1
                else:
                    expected_ids.append(rid)
                server.proc.stdin.write(line + b"\n")
            server.proc.stdin.flush()
            server.notes.clear()
            out = await anyio.to_thread.run_sync(
                lambda: server.call_tool("run_code", {"code": "6 * 7", "session_id": "s"})
            )
            assert out["structuredContent"]["results"][0]["text"] == "42"
            assert server.proc.poll() is None
            # every garbage line got exactly one error, before the proper call's answer
            errors = [n for n in server.notes if "error" in n]
            assert sorted(n["id"] for n in errors if n["id"] is not None) == expected_ids, errors
            assert sum(n["id"] is None for n in errors) == nulls, (batch, errors)
            for n in errors:
                assert "Nothing was done" in n["error"]["message"], n
    finally:
        server.close_stdin()
        assert await anyio.to_thread.run_sync(server.wait) == 0
    assert "Traceback" not in server.log.read_text(errors="replace")


def test_a_client_that_closes_stdout_stops_the_server_in_order(tmp_path: Path) -> None:
    server = StdioServer.start(tmp_path, "--sandbox", "none", "--embedding-model", "none")
    try:
        server.call_tool("run_code", {"code": "1", "session_id": "s"})
        assert descendants(server.proc.pid)  # a kernel runs
        assert server.proc.stdout is not None and server.proc.stdin is not None
        server.proc.stdout.close()
        server.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 99, "method": "tools/list"}\n')
        server.proc.stdin.flush()
        assert server.proc.wait(60) == 0
    finally:
        server.kill()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "stdout closed" in log
    assert wait_until(lambda: not mentioning(str(tmp_path)), 30), mentioning(str(tmp_path))  # kernels stopped


def test_stdin_from_a_file_is_answered_line_by_line(tmp_path: Path) -> None:
    """stdin that is a file is read on a thread (not the event loop): the same answers, and a
    line past the limit is read past without being kept."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "f", "version": "0"},
        },
    }
    lines = [
        body_of(init),
        body_of({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        b"[" * 200_000,
        b"\xff not UTF-8",
        b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"x": "' + b"a" * (2 * MIB) + b'"}}',
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n".join(lines) + b"\n")
    with requests.open("rb") as stdin:
        done = subprocess.run(
            procs.serve_argv(tmp_path / "data", "--sandbox", "none", "--max-request-mb", str(LIMIT_MB)),
            stdin=stdin,
            capture_output=True,
            env=procs.server_env(tmp_path),
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [1, None, None, 5], answers
    assert "nested too deeply" in answers[1]["error"]["message"]
    assert "not valid UTF-8" in answers[2]["error"]["message"]
    assert "This message is 2.0 MB" in answers[3]["error"]["message"]
    assert b"Traceback" not in done.stderr

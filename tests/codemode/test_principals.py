"""Code mode over the real transports: two principals over HTTP (each one's code acts in its own
memory, never the other's; a flood from one principal's code does not keep the other waiting), and
the stdio user.

``kernmind serve`` processes, real kernels in the sandbox the machine allows, real SQLite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.codemode.conftest import run_emitting
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, StdioServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode-http"), pytest.mark.slow]

FAST = ("--embedding-model", "none", "--preload", "[]")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("codemode-http")
    file = TokenFile(tmp / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    server = start_http(tmp, "--tokens", str(file.path), "--pool-size", "1", *FAST)
    try:
        yield server, tokens
    finally:
        server.stop()


@pytest.fixture
async def alice(deployment: tuple[HttpServer, dict[str, str]]) -> AsyncIterator[Client]:
    server, tokens = deployment
    async with http_client(server.url, {"Authorization": f"Bearer {tokens['alice']}"}, "auto") as c:
        yield c


@pytest.fixture
async def bob(deployment: tuple[HttpServer, dict[str, str]]) -> AsyncIterator[Client]:
    server, tokens = deployment
    async with http_client(server.url, {"Authorization": f"Bearer {tokens['bob']}"}, "auto") as c:
        yield c


async def test_each_principals_code_acts_in_its_own_memory(
    alice: Client, bob: Client, deployment: tuple[HttpServer, dict[str, str]]
) -> None:
    (stored, block) = await run_emitting(
        alice,
        """
import kernmind_tools as km
emit(km.archival_memory_insert(content="alice's launch plan is codenamed heron", tags=["plan"])["id"])
emit(km.memory_create(label="alice_notes", value="heron ships in May")["version"])
""",
        session_id="work",
    )
    (found, refusal, own) = await run_emitting(
        bob,
        """
import kernmind_tools as km
emit(km.archival_memory_search(query="launch plan heron")["results"])
try:
    km.memory_read(label="alice_notes")
    emit(None)
except km.ToolError as e:
    emit(str(e))
emit(km.archival_memory_insert(content="bob keeps the budget spreadsheet")["id"])
""",
        session_id="work",  # the same session name: a session of bob's own
    )
    assert found == []
    assert refusal is not None and "alice_notes" in refusal
    # What each one's code stored is what that principal's client finds, and only that.
    alice_sees = structured(await alice.call_tool("archival_memory_search", {"query": "launch plan heron"}))
    assert [r["id"] for r in alice_sees["results"]] == [stored]
    assert (
        structured(await alice.call_tool("memory_read", {"label": "alice_notes"}))["value"]
        == "heron ships in May"
    )
    assert "alice_notes" in error_text(await bob.call_tool("memory_read", {"label": "alice_notes"}))
    bob_sees = structured(await bob.call_tool("archival_memory_search", {"query": "budget spreadsheet"}))
    assert [r["id"] for r in bob_sees["results"]] == [own]
    assert (
        structured(await alice.call_tool("archival_memory_search", {"query": "budget spreadsheet"}))[
            "results"
        ]
        == []
    )
    assert block >= 1
    log = deployment[0].log_text()
    assert "code call archival_memory_insert from session 'work' of 'alice'" in log  # logged as from code


async def test_a_flood_from_one_principals_code_does_not_keep_another_waiting(
    alice: Client, bob: Client
) -> None:
    """alice's code floods the channel from four threads until told to stop (a block alice's
    client creates); bob's client and bob's code are served meanwhile, before alice stops."""
    flood = """
import threading, kernmind_tools as km
counts = [0] * 4
def worker(n):
    while True:
        km.archival_memory_insert(content=f"flood {n} {counts[n]}", tags=["flood"])
        counts[n] += 1
        if counts[n] % 10 == 0:
            try:
                km.memory_read(label="stop")
                return
            except km.ToolError:
                pass
threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("inserted", sum(counts))
"""
    job = structured(
        await alice.call_tool(
            "run_code", {"code": flood, "session_id": "flood", "background": True, "timeout": 300}
        )
    )
    try:
        for _ in range(1200):  # until the flood has begun (a bound on a hang only)
            search = {"query": "", "tags": ["flood"]}
            if structured(await alice.call_tool("archival_memory_search", search))["results"]:
                break
            await anyio.sleep(0.1)
        for i in range(5):
            structured(await bob.call_tool("archival_memory_insert", {"content": f"bob's note {i}"}))
            structured(await bob.call_tool("archival_memory_search", {"query": "note"}))
        (bobs,) = await run_emitting(
            bob, "import kernmind_tools as km\nemit(len(km.archival_memory_search(query='note')['results']))",
            session_id="meanwhile",
        )  # fmt: skip
        assert bobs >= 5
        status = structured(await alice.call_tool("job_status", {"job_id": job["job_id"]}))
        assert status["state"] == "running"  # bob was served while alice's flood went on
    finally:
        structured(await alice.call_tool("memory_create", {"label": "stop", "value": "enough"}))
    for _ in range(600):  # until the flood has stopped (a bound on a hang only)
        status = structured(await alice.call_tool("job_status", {"job_id": job["job_id"]}))
        if status["state"] != "running":
            break
        await anyio.sleep(0.2)
    assert status["state"] == "done", status
    text = str(status)
    assert "inserted" in text


def test_code_mode_over_stdio(tmp_path: Path) -> None:
    server = StdioServer.start(tmp_path, *FAST)
    try:
        result = server.call_tool(
            "run_code",
            {
                "code": "import kernmind_tools as km\n"
                "print(km.archival_memory_insert(content='said over stdio, stored from code')['id'])",
                "timeout": 120,
            },
        )
        structured_result = result["structuredContent"]
        assert structured_result["status"] == "ok", structured_result
        stored = int("".join(structured_result["logs"]["stdout"]).strip())
        found = server.call_tool("archival_memory_search", {"query": "stored from code"})["structuredContent"]
        assert [r["id"] for r in found["results"]] == [stored]
    finally:
        server.close_stdin()
        server.wait()

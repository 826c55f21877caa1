"""Several ``kernmind serve --transport http`` replicas on one database behave as one memory.

4 replicas × 2 clients do blind appends and ``expected_version`` edits: every acknowledged
write is stored exactly once and every replica sees it at once; a replica killed with SIGKILL
mid-burst loses no acknowledged write while the others keep serving; on PostgreSQL a
block change made through one replica reaches resource subscribers of another (NOTIFY).
Runs on both backends (several processes on one SQLite file are safe too); the notification
case needs PostgreSQL.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from tests.transport.procs import HttpServer, start_http

from .conftest import db_location, ok, on_postgres

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("replicas"), pytest.mark.slow]

APPENDS = 25
EDITS = 8


@contextlib.contextmanager
def running_replicas(tmp_path: Path, count: int) -> Iterator[list[HttpServer]]:
    db = db_location(tmp_path, "shared.db")
    servers: list[HttpServer] = []
    try:
        for i in range(count):
            (tmp_path / f"r{i}").mkdir()
            servers.append(
                start_http(tmp_path / f"r{i}", "--db", db, "--sandbox", "none", "--embedding-model", "none")
            )
        yield servers
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[HttpServer]]:
    with running_replicas(tmp_path, 4) as servers:
        yield servers


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[list[HttpServer]]:
    with running_replicas(tmp_path, 2) as servers:
        yield servers


async def increment(client: Client, stats: dict[str, int]) -> None:
    """Add one to the shared counter with expected_version, retrying on a conflict."""
    while True:
        block = await ok(client, "memory_read", label="counter")
        r = await client.call_tool(
            "memory_rethink",
            {
                "label": "counter",
                "new_memory": str(int(block["value"]) + 1),
                "expected_version": block["version"],
            },
        )
        if not r.is_error:
            return
        assert re.search(r"is at version \d+, not expected_version", r.content[0].text), r.content[0].text
        stats["conflicts"] += 1


async def test_four_replicas_lose_nothing(replicas: list[HttpServer]) -> None:
    acked: list[str] = []
    stats = {"conflicts": 0}
    async with replicas[0].client() as first:
        await ok(first, "memory_create", label="log", limit=100_000)
        await ok(first, "memory_create", label="counter", value="0")

    async def worker(server: HttpServer, name: str) -> None:
        async with server.client() as client:
            for i in range(APPENDS):
                line = f"{name}-{i:02d}"
                await ok(client, "memory_append", label="log", content=line)
                acked.append(line)
                if i < EDITS:
                    await increment(client, stats)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for r, server in enumerate(replicas):
                for c in range(2):
                    tg.start_soon(worker, server, f"r{r}c{c}")
    assert len(acked) == 8 * APPENDS
    for server in replicas:  # every replica sees the same final state
        async with server.client() as client:
            lines = (await ok(client, "memory_read", label="log"))["value"].split("\n")
            assert sorted(lines) == sorted(acked)
            counter = await ok(client, "memory_read", label="counter")
            assert counter["value"] == str(8 * EDITS) and counter["version"] == 1 + 8 * EDITS
    print(f"expected_version conflicts retried: {stats['conflicts']}")


async def test_a_write_is_visible_on_every_replica_at_once(two_replicas: list[HttpServer]) -> None:
    async with two_replicas[0].client() as a, two_replicas[1].client() as b:
        for i in range(5):
            await ok(a, "memory_rethink", label="human", new_memory=f"value {i}")
            assert (await ok(b, "memory_read", label="human"))["value"] == f"value {i}"
            passage = await ok(b, "archival_memory_insert", content=f"replicated note number {i}")
            found = (await ok(a, "archival_memory_search", query=f"replicated note {i}"))["results"]
            assert passage["id"] in [r["id"] for r in found]


async def test_sigkill_of_a_replica_mid_burst_loses_no_acknowledged_write(
    two_replicas: list[HttpServer],
) -> None:
    victim, survivor = two_replicas
    acked: list[str] = []
    enough = anyio.Event()
    async with survivor.client() as s:
        await ok(s, "memory_create", label="burst", limit=100_000)

    async def burst(name: str) -> None:
        try:
            async with victim.client() as client:
                for i in range(10_000):
                    r = await client.call_tool(
                        "memory_append", {"label": "burst", "content": f"{name}-{i:04d}"}
                    )
                    if victim.proc.poll() is not None:
                        return  # an answer racing the kill is not counted
                    assert not r.is_error, r.content[0].text
                    acked.append(f"{name}-{i:04d}")
                    if len(acked) >= 60:
                        enough.set()
        except Exception:
            return  # the connection died with the replica

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(burst, "x")
            tg.start_soon(burst, "y")
            await enough.wait()
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
    async with survivor.client() as s:
        lines = set((await ok(s, "memory_read", label="burst"))["value"].split("\n"))
        assert set(acked) <= lines and len(lines) <= len(acked) + 2  # at most one in flight per client
        await ok(s, "memory_append", label="burst", content="still serving")


async def test_notifications_reach_subscribers_of_other_replicas(tmp_path: Path) -> None:
    if not on_postgres():
        pytest.skip("notifications across processes need PostgreSQL (LISTEN/NOTIFY)")
    got = anyio.Event()
    uris: list[str] = []
    with running_replicas(tmp_path, 2) as (one, two):
        await listen_on_one_write_on_other(one, two, got, uris)
    assert uris == ["memory://blocks/human"]


async def listen_on_one_write_on_other(
    one: HttpServer, two: HttpServer, got: anyio.Event, uris: list[str]
) -> None:
    async with one.client(mode="2026-07-28") as listener, two.client() as writer:
        async with listener.listen(resource_subscriptions=["memory://blocks/human"]) as sub:

            async def collect() -> None:
                async for event in sub:
                    if isinstance(event, ResourceUpdated):
                        uris.append(event.uri)
                        got.set()
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)  # (entering listen() waited for the server's ack: it is subscribed)
                await ok(writer, "memory_append", label="human", content="written on another replica")
                with anyio.fail_after(60):  # a hang bound only
                    await got.wait()
                tg.cancel_scope.cancel()

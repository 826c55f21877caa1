"""Concurrency and crash safety on one SQLite file shared by several servers and processes.

* 8 writers append 40 lines each to one block with ``expected_version`` and retry: six are
  tasks on two in-process servers (two connections), two are separate ``kernmind serve``
  processes over stdio. Every line must arrive exactly once and in each writer's order, and no
  "database is locked" may ever reach a client.
* A server process is killed with SIGKILL in the middle of a write burst (block appends and
  archival inserts in flight); after reopening, every acknowledged write is there and
  ``PRAGMA integrity_check`` passes.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from kernmind.memory.database import PassageFilter
from kernmind.memory.sqlite import SQLiteDatabase
from kernmind.memory.store import MemoryStore
from kernmind.server import create_server

from .conftest import make_settings, ok

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WRITES = 40


def stdio_server(db: Path | str, data_dir: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "kernmind", "serve", "--db", str(db), "--data-dir", str(data_dir)),
            *("--sandbox", "none", "--pool-size", "0", "--log-level", "WARNING"),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def append_with_retry(client: Client, label: str, name: str, stats: dict[str, int]) -> None:
    version = (await ok(client, "memory_read", label=label))["version"]
    done = 0
    while done < WRITES:
        r = await client.call_tool(
            "memory_append", {"label": label, "content": f"{name}-{done:03d}", "expected_version": version}
        )
        if r.is_error:
            text = r.content[0].text
            assert "locked" not in text.lower() and "busy" not in text.lower(), text
            m = re.search(r"is at version (\d+), not expected_version", text)
            assert m, text
            version = int(m.group(1))
            stats["conflicts"] += 1
            await anyio.sleep(random.random() * 0.003)
            continue
        version = r.structured_content["version"]
        done += 1


async def test_eight_writers_two_processes_no_lost_update(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stats = {"conflicts": 0}
    async with Client(create_server(settings)) as c1, Client(create_server(settings)) as c2:
        await ok(c1, "memory_create", label="log", limit=100_000)
        async with (
            Client(stdio_server(settings.db_location, tmp_path)) as p1,
            Client(stdio_server(settings.db_location, tmp_path)) as p2,
        ):
            with anyio.fail_after(
                300
            ):  # a hang guard: ~60 s alone on PostgreSQL, minutes on a loaded 2-core VM
                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(append_with_retry, c1, "log", f"a{i}", stats)
                        tg.start_soon(append_with_retry, c2, "log", f"b{i}", stats)
                    tg.start_soon(append_with_retry, p1, "log", "p1", stats)
                    tg.start_soon(append_with_retry, p2, "log", "p2", stats)
            # the other processes see the final state too
            final = await ok(p1, "memory_read", label="log")
        lines = final["value"].split("\n")
        assert len(lines) == 8 * WRITES
        assert len(set(lines)) == 8 * WRITES
        for name in ["a0", "a1", "a2", "b0", "b1", "b2", "p1", "p2"]:
            mine = [x for x in lines if x.startswith(name + "-")]
            assert mine == [f"{name}-{i:03d}" for i in range(WRITES)], name
        assert final["version"] == 1 + 8 * WRITES
        versions: list[int] = []  # the newest 300 entries, a page within the output budget at a time
        while len(versions) < 300:
            page = await ok(
                c2, "memory_history", label="log", limit=300 - len(versions), offset=len(versions)
            )
            versions += [e["version"] for e in page["entries"]]
            assert page["entries"] and (page["next_offset"] is not None or len(versions) == 300)
        assert versions == list(range(final["version"], final["version"] - 300, -1))
    print(f"conflicts retried: {stats['conflicts']}")


def child_pids_running(marker: str) -> list[int]:
    """Our own child processes whose command line contains ``marker`` (read from /proc)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and marker in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.sqlite_only("SQLite's file integrity after SIGKILL (replicas on PostgreSQL: test_replicas.py)")
async def test_kill_9_mid_burst_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    acked_lines: list[str] = []
    acked_passages: dict[int, str] = {}
    killed = anyio.Event()
    enough = anyio.Event()  # both bursts have 150 acknowledged writes
    refused: list[str] = []  # writes the live server refused (kept out of the transport's error)

    def check_enough() -> None:
        if len(acked_lines) >= 150 and len(acked_passages) >= 150:
            enough.set()

    async def block_burst(client: Client) -> None:
        for i in range(10_000):
            try:
                r = await client.call_tool("memory_append", {"label": "burst", "content": f"line-{i:05d}"})
            except Exception:
                return
            if killed.is_set():
                return  # an answer racing the kill is not counted either way
            if r.is_error:
                refused.append(r.content[0].text)
                return
            acked_lines.append(f"line-{i:05d}")
            check_enough()

    async def archival_burst(client: Client) -> None:
        for i in range(10_000):
            content = f"passage number {i} about crash safety"
            try:
                r = await client.call_tool("archival_memory_insert", {"content": content, "tags": ["crash"]})
            except Exception:
                return
            if killed.is_set():
                return
            if r.is_error:
                refused.append(r.content[0].text)
                return
            acked_passages[r.structured_content["id"]] = content
            check_enough()

    try:
        async with Client(stdio_server(db, tmp_path), read_timeout_seconds=10) as client:
            await ok(client, "memory_create", label="burst", limit=100_000)
            [pid] = child_pids_running(str(db))
            async with anyio.create_task_group() as tg:
                tg.start_soon(block_burst, client)
                tg.start_soon(archival_burst, client)
                with anyio.fail_after(60):
                    await enough.wait()
                os.kill(pid, signal.SIGKILL)
                killed.set()
    except Exception:  # the transport dies with the server; what the test checks is below
        if not killed.is_set():
            raise  # it failed before the kill: that is the test failing, not the server dying

    assert killed.is_set() and not refused, refused
    assert len(acked_lines) >= 150 and len(acked_passages) >= 150
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    async with MemoryStore(db) as store:  # reopen: recovers the WAL, migrations are idempotent
        value = (await store.blocks.get("burst")).value
        lines = value.split("\n")
        assert lines[: len(acked_lines)] == acked_lines  # every acknowledged append, in order
        assert len(lines) <= len(acked_lines) + 1  # at most the one in flight when killed
        found = await store.passages.get(list(acked_passages))
        assert {pid: p.content for pid, p in found.items()} == acked_passages
        hits = await store.passages.search_text("crash safety", PassageFilter(), 100_000, 0)
        assert set(acked_passages) <= {h.id for h in hits}  # the FTS index survived too
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.execute("INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")  # raises if corrupt


async def test_a_read_in_progress_does_not_hold_up_a_write_and_then_sees_it(tmp_path: Path) -> None:
    """Reads have a connection of their own: a write (another principal's, say) goes through
    while a read is still open, and the read's next statement sees it committed; the reading
    connection refuses to write."""
    db = SQLiteDatabase(tmp_path / "m.db")
    await db.open()
    try:
        async with db.write() as tx:
            await tx.run("CREATE TABLE t (x TEXT)")
            await tx.run("INSERT INTO t VALUES ('a')")
        async with db.read() as reading:
            assert await reading.all("SELECT x FROM t") == [("a",)]
            with anyio.fail_after(60):  # on one shared connection this would wait for the read forever
                async with db.write() as tx:
                    await tx.run("INSERT INTO t VALUES ('b')")
            assert await reading.all("SELECT x FROM t ORDER BY x") == [("a",), ("b",)]
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                await reading.run("DELETE FROM t")
    finally:
        await db.close()
    assert sqlite3.connect(tmp_path / "m.db").execute("SELECT count(*) FROM t").fetchone() == (2,)


async def test_an_in_memory_database_reads_what_it_wrote() -> None:
    db = SQLiteDatabase(":memory:")
    await db.open()
    try:
        async with db.write() as tx:
            await tx.run("CREATE TABLE t (x TEXT)")
            await tx.run("INSERT INTO t VALUES ('a')")
        async with db.read() as reading:
            assert await reading.all("SELECT x FROM t") == [("a",)]
    finally:
        await db.close()

"""Memory on PostgreSQL vs SQLite, same run: write and search p50, and 4 replicas vs 1.

Run: ``python benchmarks/bench_memory_backends.py [--sizes 2000,100000] [--ops 200] [--clients 8]``

Starts its own PostgreSQL (``initdb`` + ``pg_ctl``, unix socket; as root it runs as the
``postgres`` user), like the tests. For each backend and size: passages are bulk-loaded
(synthetic text, no vectors), then ``ops`` block appends (``Blocks.append``: a write
transaction with history) and ``ops`` full-text searches (``Archive.search`` with meaning
search off, the same code the tools call) are timed one at a time. Then ``kernmind serve
--transport http`` replicas on one PostgreSQL database serve ``clients`` MCP clients doing a
mixed load (per client: read a block, append to it, search archival memory; repeated),
first with 1 replica, then with 4 (clients spread over them): total operations per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # bench_memory, tests/
from tests.memory.postgres_server import PostgresServer  # noqa: E402
from tests.transport.procs import HttpServer, start_http  # noqa: E402

from bench_memory import make_passages, make_queries, make_words  # noqa: E402
from kernmind.memory.archival import Archive  # noqa: E402
from kernmind.memory.records import PassageIn  # noqa: E402
from kernmind.memory.store import MemoryStore  # noqa: E402


async def latencies(location: str, size: int, ops: int) -> tuple[float, float]:
    words = make_words()
    queries = make_queries(words, ops)
    async with MemoryStore(location, "bench", archival_max_chars=100_000) as store:
        rows = make_passages(words, size, seed=size)
        for i in range(0, len(rows), 2000):
            await store.passages.add([PassageIn(t, tags) for t, tags in rows[i : i + 2000]])
        await store.blocks.create("log", limit=100_000)
        writes = []
        for i in range(ops):
            t0 = time.perf_counter()
            await store.blocks.append("log", f"line {i}")
            writes.append((time.perf_counter() - t0) * 1000)
        archive = Archive(store.passages)
        searches = []
        for q in queries:
            t0 = time.perf_counter()
            await archive.search(q, top_k=10)
            searches.append((time.perf_counter() - t0) * 1000)
    return statistics.median(writes), statistics.median(searches)


async def mixed_load(servers: list[HttpServer], clients: int, rounds: int) -> float:
    async def client_work(server: HttpServer, n: int) -> None:
        async with server.client() as client:
            for i in range(rounds):
                await client.call_tool("memory_read", {"label": "human"})
                r = await client.call_tool("memory_append", {"label": f"c{n}", "content": f"entry {i}"})
                assert not r.is_error, r.content[0].text
                await client.call_tool("archival_memory_search", {"query": f"entry {i} notes"})

    async with servers[0].client() as first:
        for n in range(clients):
            await first.call_tool("memory_create", {"label": f"c{n}", "limit": 100_000})
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(client_work, servers[n % len(servers)], n)
    return clients * rounds * 3 / (time.perf_counter() - t0)


def replicas(pg: PostgresServer, count: int, tmp: Path) -> list[HttpServer]:
    db = pg.new_database()
    servers = []
    for i in range(count):
        (tmp / f"r{count}-{i}").mkdir()
        servers.append(
            start_http(tmp / f"r{count}-{i}", "--db", db, "--sandbox", "none", "--embedding-model", "none")
        )
    return servers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,100000", help="passage counts (default 2000,100000)")
    ap.add_argument("--ops", type=int, default=200, help="timed writes and searches per size (default 200)")
    ap.add_argument("--clients", type=int, default=8, help="MCP clients of the mixed load (default 8)")
    ap.add_argument(
        "--rounds", type=int, default=25, help="read+append+search rounds per client (default 25)"
    )
    args = ap.parse_args()
    pg = PostgresServer().start()
    rows: list[tuple[str, str]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for size in (int(s) for s in args.sizes.split(",")):
                lite = anyio.run(latencies, str(Path(tmp) / f"bench-{size}.db"), size, args.ops)
                post = anyio.run(latencies, pg.new_database(), size, args.ops)
                rows.append(
                    (
                        f"block append p50 @ {size:,} passages",
                        f"SQLite {lite[0]:.2f} ms, PostgreSQL {post[0]:.2f} ms ({post[0] / lite[0]:.2f}x)",
                    )
                )
                rows.append(
                    (
                        f"full-text search p50 @ {size:,}",
                        f"SQLite {lite[1]:.2f} ms, PostgreSQL {post[1]:.2f} ms ({post[1] / lite[1]:.2f}x)",
                    )
                )
            rates = {}
            for count in (1, 4):
                servers = replicas(pg, count, Path(tmp))
                try:
                    rates[count] = anyio.run(mixed_load, servers, args.clients, args.rounds)
                finally:
                    for s in servers:
                        s.stop()
            rows.append(
                (
                    f"{args.clients} clients, mixed read/append/search",
                    f"1 replica {rates[1]:.0f} ops/s, 4 replicas {rates[4]:.0f} ops/s ({rates[4] / rates[1]:.2f}x)",
                )
            )
    finally:
        pg.stop()
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"{a:<{width}}  {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

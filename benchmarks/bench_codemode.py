"""Code mode: memory tools called from code, against the same calls made by an MCP client.

    python benchmarks/bench_codemode.py [--inserts 500] [--searches 50] [--embedding-model none]

One in-process kernmind server (real kernels in the bubblewrap sandbox, real SQLite, the
default embedding model unless told otherwise). It measures, in the same run:

- **inserts**: ``--inserts`` distinct passages stored by one ``run_code`` call through
  ``kernmind_tools.archival_memory_insert`` (the time measured inside the code, and the whole
  ``run_code`` call), against the same number stored by the client, one ``archival_memory_insert``
  tool call each (in-process client: no network, so the client's side is the cheapest possible);
- **search**: ``--searches`` ``archival_memory_search`` calls from code (one ``run_code`` call, each
  timed inside the loop), against the same queries from the client; p50 of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from kernmind.config import Settings
from kernmind.server import create_server

ROUNDS = 4
TOPICS = ["churn", "revenue", "latency", "signups", "refunds", "support tickets", "retention"]
REGIONS = ["north", "south", "east", "west", "central"]


def passage(i: int, salt: str) -> str:
    return (
        f"{salt} finding {i}: {TOPICS[i % len(TOPICS)]} in the {REGIONS[i % len(REGIONS)]} region "
        f"moved by {i % 37 + 1}% in week {i % 52 + 1}"
    )


INSERT_CODE = """
import time, kernmind_tools as km
t = time.perf_counter()
for i in range({n}):
    km.archival_memory_insert(content={passage!r}.format(i=i, topic=TOPICS[i % 7], region=REGIONS[i % 5],
                              pct=i % 37 + 1, week=i % 52 + 1), tags=["bench"])
print(round(time.perf_counter() - t, 3))
"""

SEARCH_CODE = """
import time, json, kernmind_tools as km
times = []
for q in {queries!r}:
    t = time.perf_counter()
    km.archival_memory_search(query=q, top_k=10)
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


async def run_code(client: Client, code: str, session: str) -> dict[str, Any]:
    result = await client.call_tool("run_code", {"code": code, "session_id": session, "timeout": 600})
    out = result.structured_content or {}
    if out.get("status") != "ok":
        raise RuntimeError(f"run_code failed: {json.dumps(out)[:2000]}")
    return out


async def code_searches(client: Client, queries: list[str]) -> list[float]:
    out = await run_code(client, SEARCH_CODE.format(queries=queries), "bench")
    return json.loads(out["logs"]["stdout"][-1])


async def client_searches(client: Client, queries: list[str]) -> list[float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        result = await client.call_tool("archival_memory_search", {"query": q, "top_k": 10})
        assert not result.is_error, result
        times.append(time.perf_counter() - t)
    return times


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-codemode-"))
    settings = Settings(
        data_dir=tmp, db=tmp / "kernmind.db", pool_size=1, embedding_model=args.embedding_model, timeout=600
    )
    template = "{salt} finding {i}: {topic} in the {region} region moved by {pct}% in week {week}"
    code_template = "code " + template.replace("{salt} ", "")
    async with Client(create_server(settings)) as client:
        # Warm up: the kernel, the embedding model, the database.
        await run_code(client, "import kernmind_tools as km; km.archival_memory_search(query='x')", "bench")
        await client.call_tool("archival_memory_insert", {"content": "warm up"})

        started = time.perf_counter()
        out = await run_code(
            client,
            f"TOPICS = {TOPICS!r}\nREGIONS = {REGIONS!r}\n"
            + INSERT_CODE.format(n=args.inserts, passage=code_template),
            "bench",
        )
        run_code_s = time.perf_counter() - started
        inside_s = float(out["logs"]["stdout"][-1].split()[-1])

        started = time.perf_counter()
        for i in range(args.inserts):
            result = await client.call_tool(
                "archival_memory_insert", {"content": passage(i, "client"), "tags": ["bench"]}
            )
            assert not result.is_error, result
        client_s = time.perf_counter() - started

        # Each side searches queries it has never seen (a query's embedding is cached once asked),
        # in alternating rounds (what runs in the background after the inserts lands on both).
        code_search: list[float] = []
        client_search: list[float] = []
        per_round = max(1, args.searches // ROUNDS)
        for r in range(ROUNDS):
            queries = [
                f"{TOPICS[i % 7]} {REGIONS[(i + r) % 5]} week {i % 52 + 1} round {r}"
                for i in range(2 * per_round)
            ]
            code_search += await code_searches(client, queries[::2])
            client_search += await client_searches(client, queries[1::2])

    n = args.inserts
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}, {os.cpu_count()} cores, embedding model {args.embedding_model}")
    print("| what | total | per call |")
    print("|---|---|---|")
    print(f"| {n} inserts from code (inside the loop) | {inside_s:.2f} s | {inside_s / n * 1000:.1f} ms |")
    print(f"| the same run_code call, end to end | {run_code_s:.2f} s | {run_code_s / n * 1000:.1f} ms |")
    print(f"| {n} inserts from the client (baseline) | {client_s:.2f} s | {client_s / n * 1000:.1f} ms |")
    code_p50 = statistics.median(code_search) * 1000
    client_p50 = statistics.median(client_search) * 1000
    print(f"| search p50 from code | | {code_p50:.1f} ms |")
    print(f"| search p50 from the client (baseline) | | {client_p50:.1f} ms |")
    print(
        f"ratios: inserts code/client {inside_s / client_s:.2f}, search code/client {code_p50 / client_p50:.2f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inserts", type=int, default=500)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--embedding-model", default=Settings.model_fields["embedding_model"].default)
    anyio.run(main, parser.parse_args())

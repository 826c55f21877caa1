"""kernmind's archival memory side by side with the official MCP memory server, over stdio, in one run.

    python benchmarks/bench_memory_servers.py [--facts 2000] [--searches 100] [--at 600]

Both servers run as a client starts them (a child process speaking MCP over stdio, loopback only,
each with a fresh data directory): kernmind (``kernmind serve --sandbox none --pool-size 0``: memory
only, the default embedding model) and ``@modelcontextprotocol/server-memory`` (a knowledge graph
in a JSON-lines file), installed with npm under ``build/server-memory`` (``npm install
@modelcontextprotocol/server-memory`` there; the benchmark says so when it is missing).

The same one-line facts go into both, one call a fact (kernmind ``archival_memory_insert``; the
graph ``create_entities`` with one entity holding the fact as its observation), calls alternating
between the servers so background load hits both alike; then the same searches (kernmind
``archival_memory_search``, top 5; the graph ``search_nodes``, a substring match), alternating too.
Searches are timed when ``--at`` facts are stored (≈ 600: issue 32's target, search and insert p50
≤ 10 ms) and again when all are. Times are the client's: a call's round trip, JSON-RPC and the
server's work (for kernmind: embedding the question or fact, full text, the vector index, SQLite).
Each query is a natural question about one fact; "found" counts those whose fact is in the
results (the graph matches the query as one substring, so a question rarely finds anything).
``--baseline-src DIR`` adds a third server in the same run: kernmind from another source tree's
``src`` (``git worktree add /tmp/base COMMIT``, then ``--baseline-src /tmp/base/src``), for a
before/after under the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "build" / "server-memory" / "node_modules" / ".bin" / "mcp-server-memory"

PEOPLE = ["Ana", "Ben", "Chloe", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jakob", "Keiko", "Lars"]
SURNAMES = ["Okafor", "Lindqvist", "Nakamura", "Petrenko", "Moreau", "Silva", "Novak", "Haddad", "Kowalski"]
FACTS = [
    ("{p} lives in {city} with a {pet} called {name}.", "Where does {p} live?"),
    ("{p} works as a {job} at {company}.", "What is {p}'s job?"),
    ("{p} is allergic to {food}.", "What can't {p} eat?"),
    ("{p} plays the {instrument} every {day}.", "Which instrument does {p} play?"),
    ("{p} drives a {colour} {car} bought in {year}.", "What car does {p} have?"),
]
VALUES = {
    "city": ["Oslo", "Lyon", "Porto", "Gdansk", "Graz", "Turku", "Bilbao", "Ghent"],
    "pet": ["cat", "dog", "parrot", "rabbit"],
    "name": ["Biscuit", "Pepper", "Miso", "Olive", "Rex"],
    "job": ["nurse", "data analyst", "carpenter", "teacher", "pilot"],
    "company": ["Bluepeak", "Copperleaf", "Halcyon", "Northwind", "Vantage"],
    "food": ["peanuts", "shellfish", "gluten", "kiwi", "sesame"],
    "instrument": ["cello", "piano", "violin", "drums", "flute"],
    "day": ["Monday", "Wednesday", "Friday", "Sunday"],
    "colour": ["red", "grey", "blue", "white"],
    "car": ["Volvo", "Skoda", "Fiat", "Toyota"],
    "year": ["2019", "2020", "2021", "2022"],
}


def facts(n: int, seed: int = 3) -> list[tuple[str, str]]:
    """``n`` distinct facts, each with a natural question about it."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        p = f"{rng.choice(PEOPLE)} {rng.choice(SURNAMES)}{len(out)}"
        fact, question = rng.choice(FACTS)
        values = {k: rng.choice(v) for k, v in VALUES.items()}
        text = fact.format(p=p, **values)
        if text not in seen:
            seen.add(text)
            out.append((text, question.format(p=p)))
    return out


class Server:
    def __init__(self, name: str, client: Client) -> None:
        self.name, self.client = name, client
        self.insert_ms: list[float] = []

    async def call(self, tool: str, args: dict[str, Any]) -> Any:
        result = await self.client.call_tool(tool, args)
        if result.is_error:
            raise SystemExit(f"{self.name} {tool} failed: {result.content}")
        return result

    async def insert(self, i: int, fact: str) -> None:
        t0 = time.perf_counter()
        if self.name.startswith("kernmind"):
            await self.call("archival_memory_insert", {"content": fact})
        else:
            entity = {"name": f"fact-{i}", "entityType": "fact", "observations": [fact]}
            await self.call("create_entities", {"entities": [entity]})
        self.insert_ms.append((time.perf_counter() - t0) * 1000)

    async def search(self, question: str, fact: str) -> tuple[float, bool]:
        t0 = time.perf_counter()
        if self.name.startswith("kernmind"):
            out = await self.call("archival_memory_search", {"query": question, "top_k": 5})
            ms = (time.perf_counter() - t0) * 1000
            found = any(r["content"] == fact for r in out.structured_content["results"])
        else:
            out = await self.call("search_nodes", {"query": question})
            ms = (time.perf_counter() - t0) * 1000
            found = fact in json.dumps(out.structured_content or {})
        return ms, found


async def searches(servers: list[Server], asked: list[tuple[str, str]]) -> dict[str, tuple[float, int]]:
    ms: dict[str, list[float]] = {s.name: [] for s in servers}
    found = dict.fromkeys(ms, 0)
    for k, (fact, question) in enumerate(asked):
        for s in servers if k % 2 == 0 else servers[::-1]:
            took, hit = await s.search(question, fact)
            ms[s.name].append(took)
            found[s.name] += hit
    return {name: (statistics.median(v), found[name]) for name, v in ms.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=2000)
    ap.add_argument("--searches", type=int, default=100)
    ap.add_argument("--at", type=int, default=600, help="also search when this many facts are stored")
    ap.add_argument(
        "--baseline-src", help="also run kernmind from this source tree's src folder (before/after)"
    )
    args = ap.parse_args(argv)
    if not GRAPH.exists():
        raise SystemExit(
            f"{GRAPH} is missing: cd {GRAPH.parents[2]} && npm install @modelcontextprotocol/server-memory"
        )
    stored = facts(args.facts)
    rng = random.Random(5)
    started = time.monotonic()

    async def go() -> list[str]:
        lines = []
        with tempfile.TemporaryDirectory() as data:
            env = {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}

            def kernmind(folder: str, src: str | None = None) -> StdioServerParameters:
                extra = {"PYTHONPATH": src} if src else {}
                return StdioServerParameters(
                    command=sys.executable,
                    args=[
                        "-m",
                        "kernmind",
                        "serve",
                        "--data-dir",
                        folder,
                        "--sandbox",
                        "none",
                        "--pool-size",
                        "0",
                    ],
                    env={**env, **extra},
                )

            graph = StdioServerParameters(
                command=str(GRAPH), args=[], env={**env, "MEMORY_FILE_PATH": f"{data}/graph.jsonl"}
            )
            async with contextlib.AsyncExitStack() as stack:
                servers = [Server("kernmind", await stack.enter_async_context(Client(kernmind(data))))]
                if args.baseline_src:
                    os.makedirs(f"{data}/base", exist_ok=True)
                    base = Client(kernmind(f"{data}/base", os.path.abspath(args.baseline_src)))
                    servers.append(Server("kernmind (baseline)", await stack.enter_async_context(base)))
                servers.append(Server("server-memory", await stack.enter_async_context(Client(graph))))
                for s in servers[:-1]:
                    await s.call("archival_memory_search", {"query": "warm up"})  # the model is loaded
                for i, (fact, _) in enumerate(stored):
                    for s in servers if i % 2 == 0 else servers[::-1]:
                        await s.insert(i, fact)
                    if i + 1 == args.at:
                        asked = rng.sample(stored[: args.at], min(args.searches, args.at))
                        at = await searches(servers, asked)
                        for s in servers:
                            p50, hits = at[s.name]
                            lines.append(
                                f"| {s.name} | {args.at} | {statistics.median(s.insert_ms):.1f} | {p50:.1f} | "
                                f"{hits}/{len(asked)} |"
                            )
                asked = rng.sample(stored, min(args.searches, len(stored)))
                full = await searches(servers, asked)
                for s in servers:
                    p50, hits = full[s.name]
                    lines.append(
                        f"| {s.name} | {len(stored)} | {statistics.median(s.insert_ms[args.at :]):.1f} | "
                        f"{p50:.1f} | {hits}/{len(asked)} |"
                    )
        return lines

    lines = anyio.run(go)
    print(
        f"memory servers side by side, stdio; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {time.monotonic() - started:.0f} s\n"
    )
    print(
        "| server | facts stored | insert p50 ms (since the previous row) | search p50 ms | question's fact found |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long ``kernmind memory search`` takes from the shell, where every search is a new process.

    python benchmarks/bench_memory_cli.py [--before SRC] [--runs 5] [--passages 2000]

Rows, each the median of ``--runs`` runs (subprocesses, as a user runs them), on a namespace of
``--passages`` short notes whose vectors are already stored, default model:
- ``words only``: ``--embedding-model none`` (interpreter, package, database: the floor);
- ``query asked before``: the same query as an earlier search;
- ``new query``: a query no search asked before;
- ``empty namespace``: a new query on a namespace with no passages.

The model's built graph and the query-vector cache live in a temporary ``XDG_CACHE_HOME``, warmed
by one search first (the graph is built there once). With ``--before SRC`` (another checkout's
``src``, e.g. from ``git archive <commit> src``), every row is also measured for that code
(``PYTHONPATH=SRC``), interleaved run by run, and the ratio after / before is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = """
import sys, anyio
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore

async def go(db, n):
    async with MemoryStore(db, "default") as store:
        await store.passages.add([PassageIn(
            f"note {i}: the {('design', 'budget', 'release', 'hiring')[i % 4]} meeting on topic {i} "
            f"decided to ship feature {i * 7} by week {i % 52}", ["t"]) for i in range(n)])
anyio.run(go, sys.argv[1], int(sys.argv[2]))
"""


def env_for(src: str | None, cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}
    env["XDG_CACHE_HOME"] = cache
    if src:
        env["PYTHONPATH"] = src
    return env


def search(db: str, query: str, env: dict[str, str], *extra: str) -> float:
    cmd = [sys.executable, "-m", "kernmind", "memory", "search", query, "--db", db, "--top-k", "3", *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0 or "unavailable" in proc.stdout + proc.stderr:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="another checkout's src directory, measured the same way")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--passages", type=int, default=2000)
    args = parser.parse_args()
    sides: dict[str, str | None] = {"after": None}
    if args.before:
        sides = {"before": str(Path(args.before).resolve()), "after": None}
    work = Path(tempfile.mkdtemp(prefix="bench-memory-cli-"))
    cache = str(work / "cache")
    db, empty = str(work / "notes.db"), str(work / "empty.db")
    subprocess.run([sys.executable, "-c", SEED, db, str(args.passages)], check=True, env=env_for(None, cache))
    subprocess.run([sys.executable, "-c", SEED, empty, "0"], check=True, env=env_for(None, cache))
    search(db, "warm up: build the graph, embed the passages", env_for(None, cache))
    fresh = (
        f"what did the {w} meeting decide about feature {i}" for i, w in enumerate(itertools.cycle("abc"))
    )
    results: dict[tuple[str, str], list[float]] = {}
    load = os.getloadavg()[0]
    for src in sides.values():  # the query asked before: asked once on each side first
        search(db, "what did we decide about the release", env_for(src, cache))
    for i in range(args.runs):
        for side, src in sides.items():
            env = env_for(src, cache)
            rows = {
                "words only (--embedding-model none)": search(
                    db, "what did we decide about the release", env, "--embedding-model", "none"
                ),
                "query asked before": search(db, "what did we decide about the release", env),
                "new query": search(db, next(fresh), env),
                "empty namespace, new query": search(empty, next(fresh), env),
            }
            for row, value in rows.items():
                results.setdefault((row, side), []).append(value)
        print(f"  run {i + 1}/{args.runs} done", file=sys.stderr)
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {load:.1f} → {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores, {args.passages} passages, median of {args.runs}")  # fmt: skip
    print(f"\n| row | {' | '.join(sides)} |" + (" after / before |" if len(sides) > 1 else ""))
    print("|---|" + "---|" * (len(sides) + (len(sides) > 1)))
    for row in dict.fromkeys(r for r, _ in results):
        medians = [statistics.median(results[(row, side)]) for side in sides]
        ratio = f" {medians[1] / medians[0]:.2f} |" if len(sides) > 1 else ""
        print(f"| {row} | " + " | ".join(f"{m:.2f} s" for m in medians) + " |" + ratio)


if __name__ == "__main__":
    main()

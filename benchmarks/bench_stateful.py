"""Stateful ``run_code`` ``1+1`` over stdio against the raw ``jupyter_client`` floor, interleaved.

    python benchmarks/bench_stateful.py [--rounds 10] [--batch 30] [--sandbox bwrap] [--compare SRC]

``bench_python.py`` measures its rows one after the other, so on a shared machine a change of
load between the floor and the kernmind rows moves the ratio. Here the arms alternate in
batches (floor, kernmind, and with ``--compare`` a second kernmind from another source tree,
e.g. a ``git worktree`` of the commit before a change, or ``git archive REV src kernels``: the
kernelspec in ``kernels/`` is needed), so each sees the same load; the
ratio is p50 against the floor's p50 in the same run. Also printed: the server's CPU time
per call (user + system, every thread), which load changes less than wall time, and a
``tools/call`` of a tool that does not exist on the same client (answered "Unknown tool"): the
MCP round trip alone, which any tool pays on top of the floor (``list_sessions``, which lists
stored sessions on a thread, is not a no-op: it costs ≈ 0.9 ms more).

The floor is a stock ipykernel. kernmind's kernels run a setup cell (``kernels/setup.py``)
that, among other things, drops ipykernel's half-millisecond sleep before each reply and its
round trips for empty flushes, so a kernmind call can come close to the stock floor or under
it. A second floor, ``floor, kernmind's setup cell``, is the same raw round trip to a kernel
that ran that setup cell: the ratio against it is what the server itself adds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_python import SNIPPET, _execute, pct, raw_kernel

SRC = Path(__file__).resolve().parents[1] / "src"
NOOP = "a refused call (no tool runs)"  # the MCP round trip alone, on the kernmind arm's server
TUNED = "floor, kernmind's setup cell"  # the raw round trip to a kernel set up as kernmind's are


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text()
    fields_after = fields[fields.rindex(")") + 2 :].split()
    return (int(fields_after[11]) + int(fields_after[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=30)
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--compare", type=Path, help="another tree's src/ to run as a second arm")
    args = ap.parse_args()
    trees = {"kernmind": SRC, **({"compare": args.compare.resolve()} if args.compare else {})}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        pids: dict[str, int] = {}
        for name, src in trees.items():
            data = stack.enter_context(tempfile.TemporaryDirectory())
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "kernmind", "serve", "--data-dir", data, "--sandbox", args.sandbox,
                      "--pool-size", "2", "--log-level", "WARNING"],
                env={**os.environ, "PYTHONPATH": str(src)},
            )  # fmt: skip
            client = await stack.enter_async_context(Client(params))
            await client.list_tools()
            for _ in range(20):
                warm = await client.call_tool("run_code", {"code": SNIPPET})
            if (warm.structured_content or {}).get("status") != "ok":  # an arm that fails is fast and wrong
                sys.exit(f"{name} ({src}) does not run code: {warm.structured_content or warm.content}")
            found = subprocess.run(
                ["pgrep", "-f", f"kernmind serve --data-dir {data}"], capture_output=True, text=True
            )
            pids[name] = int(found.stdout.split()[0])
            clients[name] = client
        floors = {
            "floor": await stack.enter_async_context(floor_kernel()),
            TUNED: await stack.enter_async_context(floor_kernel(setup=True)),
        }
        await anyio.sleep(3)  # the warm pools have filled
        times: dict[str, list[float]] = {
            "floor": [], TUNED: [], **{name: [] for name in clients}, NOOP: []
        }  # fmt: skip
        used: dict[str, float] = {}
        for _ in range(args.rounds):
            for name in times:
                pid = pids.get("kernmind" if name == NOOP else name)
                before = cpu_seconds(pid) if pid else 0.0
                for _ in range(args.batch):
                    t = time.perf_counter()
                    if name in floors:
                        await _execute(floors[name], SNIPPET)
                    elif name == NOOP:
                        await clients["kernmind"].call_tool("no_such_tool", {})  # "Unknown tool"
                    else:
                        await clients[name].call_tool("run_code", {"code": SNIPPET})
                    times[name].append(time.perf_counter() - t)
                if pid:
                    used[name] = used.get(name, 0.0) + cpu_seconds(pid) - before
        cpu = {name: seconds / len(times[name]) for name, seconds in used.items()}
    floor = pct(times["floor"], 0.5)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.batch} calls per arm")
    print("| arm | p50 (ms) | p99 (ms) | vs floor | server CPU per call (ms) |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        used = f"{cpu[name] * 1000:.2f}" if name in cpu else ""
        print(f"| {name} | {p50 * 1000:.2f} | {p99 * 1000:.2f} | {p50 / floor:.2f}x | {used} |")
    print(f"\nstateful p50 / raw floor = {pct(times['kernmind'], 0.5) / floor:.2f}x   (target <= 1.3x)")
    print(
        f"stateful p50 / raw floor on a kernel with kernmind's setup cell = "
        f"{pct(times['kernmind'], 0.5) / pct(times[TUNED], 0.5):.2f}x   (what the server adds)"
    )
    noop, tuned = pct(times[NOOP], 0.5), pct(times[TUNED], 0.5)
    print(
        f"a tools/call that runs no tool costs {noop * 1000:.2f} ms over the same stdio client: no tool "
        f"that runs the set-up kernel's round trip can be under {(tuned + noop) / tuned:.2f}x of that floor"
    )


@contextlib.asynccontextmanager
async def floor_kernel(*, setup: bool = False) -> AsyncIterator[Any]:
    """A stock ipykernel's client, warmed up; with ``setup``, after running kernmind's setup cell."""
    code = None
    if setup:
        sys.path.insert(0, str(SRC))
        from kernmind.budget import Budget
        from kernmind.config import Settings
        from kernmind.execution.kernels.setup import setup_code

        code = setup_code(Budget(Settings().max_output_chars))
    async with raw_kernel(code) as (_, kc):
        for _ in range(20):
            await _execute(kc, SNIPPET)
        yield kc


if __name__ == "__main__":
    anyio.run(main)

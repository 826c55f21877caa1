"""Python run_code latency over a real stdio MCP client, against baselines measured in the same run.

    python benchmarks/bench_python.py [--n 200] [--resets 20]

Rows (all for the snippet ``1+1``):
- raw floor: a plain ``jupyter_client`` kernel (no sandbox, no MCP), execute round trip
- restart per call: ``restart_kernel`` + ready + execute (what "fresh state" costs naively)
- subprocess per call: a fresh ``python`` running the snippet through an exec wrapper
- kernmind stateful / reset, over stdio, with ``--sandbox bwrap`` and ``--sandbox none``
- launch → first tools/list answer

Ratios are against the raw floor (and reset against stateful). Reset calls are paced so
the warm pool has refilled before each one ("while the pool is warm").
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
from jupyter_client.manager import AsyncKernelManager
from mcp import Client, StdioServerParameters

SNIPPET = "1+1"
EXEC_WRAPPER = (
    "import ast,sys\n"
    "src=sys.argv[1]\n"
    "tree=ast.parse(src)\n"
    "last=tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None\n"
    "ns={}\n"
    "exec(compile(tree,'<cell>','exec'),ns)\n"
    "if last is not None: print(repr(eval(compile(ast.Expression(last.value),'<cell>','eval'),ns)))\n"
)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def _execute(kc: object, code: str) -> None:
    msg_id = kc.execute(code)  # type: ignore[attr-defined]
    while True:
        msg = await kc.get_iopub_msg()  # type: ignore[attr-defined]
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                break
    while True:
        reply = await kc.get_shell_msg()  # type: ignore[attr-defined]
        if reply["parent_header"].get("msg_id") == msg_id:
            return


@contextlib.asynccontextmanager
async def raw_kernel(setup: str | None = None) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """A stock ipykernel (ipc transport) and its started client, ready; ``setup`` run in it
    first when given. The floor of every Python benchmark here."""
    with tempfile.TemporaryDirectory() as tmp:
        km = AsyncKernelManager(
            kernel_name="python3", transport="ipc", ip=f"{tmp}/k", connection_file=f"{tmp}/c.json"
        )
        await km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            if setup is not None:
                await _execute(kc, setup)
            yield km, kc
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)


async def raw_floor(n: int, restarts: int) -> tuple[list[float], list[float]]:
    async with raw_kernel() as (km, kc):
        for _ in range(10):
            await _execute(kc, SNIPPET)
        warm = []
        for _ in range(n):
            t = time.perf_counter()
            await _execute(kc, SNIPPET)
            warm.append(time.perf_counter() - t)
        restart = []
        for _ in range(restarts):
            t = time.perf_counter()
            await km.restart_kernel(now=True)
            await kc.wait_for_ready(timeout=60)
            await _execute(kc, SNIPPET)
            restart.append(time.perf_counter() - t)
    return warm, restart


def subprocess_per_call(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", EXEC_WRAPPER, SNIPPET], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


async def wait_for_warm_pool(client: Client, size: int = 2) -> None:
    while True:
        listed = await client.call_tool("list_sessions", {})
        if listed.structured_content and listed.structured_content["warm_kernels"] >= size:
            break
        await anyio.sleep(0.1)
    await anyio.sleep(0.5)


async def kernmind(sandbox: str, n: int, resets: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "kernmind", "serve", "--data-dir", tmp, "--sandbox", sandbox, "--pool-size", "2",
                  "--log-level", "WARNING"],
        )  # fmt: skip
        t = time.perf_counter()
        async with Client(params) as client:
            await client.list_tools()
            startup = time.perf_counter() - t
            for _ in range(10):
                await client.call_tool("run_code", {"code": SNIPPET})
            await wait_for_warm_pool(client)  # steady state: no kernel is booting while we time
            stateful = []
            for _ in range(n):
                t = time.perf_counter()
                r = await client.call_tool("run_code", {"code": SNIPPET})
                stateful.append(time.perf_counter() - t)
                assert r.structured_content and r.structured_content["results"][0]["text"] == "2"
            reset = []
            for _ in range(resets):
                await wait_for_warm_pool(client)  # let the pool refill and the old kernel die
                t = time.perf_counter()
                r = await client.call_tool("run_code", {"code": SNIPPET, "reset": True})
                reset.append(time.perf_counter() - t)
                assert r.structured_content and r.structured_content["results"][0]["text"] == "2"
    return {"startup": [startup], "stateful": stateful, "reset": reset}


def row(name: str, values: list[float], base: float | None) -> str:
    p50, p99 = pct(values, 0.5) * 1000, pct(values, 0.99) * 1000
    ratio = f"{p50 / (base * 1000):7.2f}x" if base else "        "
    return f"| {name:<38} | {p50:9.2f} | {p99:9.2f} | {ratio} | {len(values):5d} |"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--resets", type=int, default=20)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}", file=sys.stderr)
    raw, restart = await raw_floor(args.n, max(5, args.resets // 2))
    sub = subprocess_per_call(max(20, args.n // 5))
    bw = await kernmind("bwrap", args.n, args.resets)
    no = await kernmind("none", args.n, args.resets)
    floor = pct(raw, 0.5)
    print("| case                                   |  p50 (ms) |  p99 (ms) | vs floor |     n |")
    print("|----------------------------------------|-----------|-----------|----------|-------|")
    print(row("raw jupyter_client round trip (floor)", raw, floor))
    print(row("restart kernel per call", restart, floor))
    print(row("fresh python subprocess per call", sub, floor))
    print(row("kernmind stateful, bwrap (stdio MCP)", bw["stateful"], floor))
    print(row("kernmind reset, bwrap (warm pool)", bw["reset"], floor))
    print(row("kernmind stateful, no sandbox", no["stateful"], floor))
    print(row("kernmind reset, no sandbox", no["reset"], floor))
    print(row("launch -> first tools/list, bwrap", bw["startup"], None))
    s50, r50 = pct(bw["stateful"], 0.5), pct(bw["reset"], 0.5)
    print()
    print(f"stateful p50 / raw floor      = {s50 / floor:.2f}x   (target <= 1.3x)")
    print(f"reset p50 / stateful p50      = {r50 / s50:.2f}x   (target <= 3x)")
    print(f"restart-per-call / reset p50  = {pct(restart, 0.5) / r50:.1f}x   (target >= 20x)")
    print(
        f"sandbox cost, warm stateful   = {pct(bw['stateful'], 0.5) / pct(no['stateful'], 0.5) - 1:+.1%}"
        f"; reset {pct(bw['reset'], 0.5) / pct(no['reset'], 0.5) - 1:+.1%}   (target <= +10%)"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    anyio.run(main)

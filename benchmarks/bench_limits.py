"""What per-session limits cost a call: the quota's bookkeeping and the control groups.

    python benchmarks/bench_limits.py [--calls 60] [--files 20000]

In-process servers (bwrap sandbox), each measured in the same run:

- a trivial ``1+1`` call's p50, and the p50 of the quota's work around it (``before_call``:
  the io mark of the session's processes, a walk only if they wrote; ``after_call``: the
  runtime directory's walk and the mark), with ``--cgroups auto`` and ``--cgroups none``;
- the same in a session holding ``--files`` files (the change scan's budget runs out: the
  estimate from the processes' disk writes replaces a full walk);
- ``--stateless`` ``1+1`` p50 with and without groups (a group made, adopted and removed per
  call).

The "quota share" column is the bookkeeping's part of the call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from kernmind.config import Settings
from kernmind.execution import supervisor
from kernmind.execution.sandbox import quota
from kernmind.server import create_server

MAKE_FILES = """
import os
for d in range({n} // 1000):
    os.makedirs(f"tree/d{{d}}", exist_ok=True)
    for i in range(1000):
        open(f"tree/d{{d}}/f{{i}}.txt", "w").close()
"""

spent: list[float] = []
_before, _after = quota.before_call, quota.after_call


async def _timed_before(*args: Any, **kw: Any) -> Any:
    t = time.perf_counter()
    try:
        return await _before(*args, **kw)
    finally:
        spent.append(time.perf_counter() - t)


async def _timed_after(*args: Any, **kw: Any) -> Any:
    t = time.perf_counter()
    try:
        return await _after(*args, **kw)
    finally:
        spent[-1] += time.perf_counter() - t


supervisor.workspace_quota.before_call = _timed_before  # type: ignore[attr-defined]
supervisor.workspace_quota.after_call = _timed_after  # type: ignore[attr-defined]


async def calls(client: Client, n: int, args: dict[str, Any]) -> tuple[float, float]:
    """(call p50, quota bookkeeping p50) in ms."""
    spent.clear()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        result = await client.call_tool("run_code", args)
        assert not result.is_error, result
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), statistics.median(spent) * 1000 if spent else 0.0


async def stateful(mode: str, n: int, files: int) -> list[tuple[str, float, float]]:
    with tempfile.TemporaryDirectory(prefix="km-bench-limits-") as tmp:
        settings = Settings(
            data_dir=Path(tmp), pool_size=1, cgroups=mode, embedding_model="none", timeout=600
        )
        async with Client(create_server(settings)) as client:
            for sid in ("small", "big"):
                await client.call_tool("run_code", {"code": "1", "session_id": sid})
            made = await client.call_tool(
                "run_code", {"code": MAKE_FILES.format(n=files), "session_id": "big"}
            )
            assert not made.is_error, made
            rows = []
            for sid in ("small", "big"):
                call, book = await calls(client, n, {"code": "1+1", "session_id": sid})
                rows.append((f"{sid} session, --cgroups {mode}", call, book))
            return rows


async def stateless(mode: str, n: int) -> float:
    with tempfile.TemporaryDirectory(prefix="km-bench-limits-") as tmp:
        settings = Settings(
            data_dir=Path(tmp), pool_size=2, cgroups=mode, embedding_model="none", stateless=True, timeout=600
        )
        async with Client(create_server(settings)) as client:
            await client.call_tool("run_code", {"code": "1"})
            times = []
            for _ in range(n):
                await anyio.sleep(0.3)  # let the pool refill, as bench_python does for resets
                t = time.perf_counter()
                await client.call_tool("run_code", {"code": "1+1"})
                times.append((time.perf_counter() - t) * 1000)
            return statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--files", type=int, default=20_000)
    args = parser.parse_args()
    rows = []
    for mode in ("auto", "none"):
        rows += await stateful(mode, args.calls, args.files)
    print("| call (`1+1`) | p50 | quota bookkeeping p50 | quota share |")
    print("|---|---|---|---|")
    for label, call, book in rows:
        print(f"| {label} | {call:.1f} ms | {book:.2f} ms | {book / call:.0%} |")
    with_groups = await stateless("auto", max(10, args.calls // 4))
    without = await stateless("none", max(10, args.calls // 4))
    print("\n| `--stateless` `1+1` p50 | with groups | without | ratio |\n|---|---|---|---|")
    print(f"| | {with_groups:.1f} ms | {without:.1f} ms | {with_groups / without:.2f}× |")


if __name__ == "__main__":
    anyio.run(main)

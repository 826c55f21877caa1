"""What a file system per session costs (``--workspace-fs image``) against counting alone
(``count``), over a real stdio MCP client, both servers in one run.

    python benchmarks/bench_workspace_fs.py [--sessions 12] [--calls 50] [--sandbox bwrap] [--workspace-mb 2048]

Rows, for each mode (servers with the default warm pool, measured after it is full):
- a new session's first ``1+1`` (image: the session's image is made and mounted, then a warm
  kernel's own file system is moved onto it: ``volume.adopt``);
- a stateful ``1+1`` p50 in a session that has run before;
- ``close_session`` (image: the image unmounted and deleted).

Needs root, ``mkfs.ext4`` and loop devices (the image rows), and room on the temporary directory's
disk for every image at once: each holds its ``--workspace-mb`` (and inode table) on the host. Wall clock on whatever else the
machine does: read the ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fresh import ONE, call, params, settle
from bench_python import pct


async def rows(mode: str, sandbox: str, sessions: int, calls: int, quota_mib: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        flags = ("--workspace-fs", mode, "--workspace-mb", str(quota_mib))
        async with Client(params(tmp, True, sandbox, *flags)) as client:
            await call(client, ONE, session_id="warmup")
            firsts, closes = [], []
            for i in range(sessions):
                await settle(client)
                firsts.append(await call(client, ONE, session_id=f"s{i}"))
            steady = [await call(client, ONE, session_id="s0") for _ in range(calls)]
            for i in range(sessions):
                t = time.perf_counter()
                closed = await client.call_tool("close_session", {"session_id": f"s{i}"})
                assert not closed.is_error, closed
                closes.append(time.perf_counter() - t)
    return {
        "new session's first call p50": pct(firsts, 0.5),
        "stateful call p50": pct(steady, 0.5),
        "close_session p50": pct(closes, 0.5),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--sandbox", default="auto")
    ap.add_argument("--workspace-mb", type=int, default=2048)
    args = ap.parse_args()
    count = await rows("count", args.sandbox, args.sessions, args.calls, args.workspace_mb)
    image = await rows("image", args.sandbox, args.sessions, args.calls, args.workspace_mb)
    print(f"{'row':<32} {'count ms':>9} {'image ms':>9} {'ratio':>6}")
    for name in count:
        c, i = count[name] * 1000, image[name] * 1000
        print(f"{name:<32} {c:9.1f} {i:9.1f} {i / c:6.2f}")


if __name__ == "__main__":
    anyio.run(main)

"""What a big working directory costs every call: the change scan, ``list_files``, ``files``.

    python benchmarks/bench_workspace.py [--sizes 20000 200000] [--calls 15]

For each size, one in-process server (bwrap sandbox when available) and one session that
holds that many files (made by the code itself, 1,000 per folder). Rows, p50 over
``--calls`` trivial calls (``1+1`` in Python, ``true`` in bash):

- baseline: the same calls in a session with no files, same server, same run
- big tree: the calls in the session that holds the files
- one changed file: a call that writes one new file (it must show up in ``files``)
- ``list_files``: time and the size of the answer (characters of the text block), and the
  p50 of a page deep in the listing (no walk, no sort: the tracker's sorted paths, sliced)

The ratio "big tree / baseline" is what a user feels on every call.
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
from kernmind.server import create_server

MAKE_FILES = """
import os
for d in range({n} // 1000):
    os.makedirs(f"tree/d{{d}}", exist_ok=True)
    for i in range(1000):
        open(f"tree/d{{d}}/f{{i}}.txt", "w").close()
"""


async def timed(client: Client, tool: str, args: dict[str, Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    result = await client.call_tool(tool, args)
    return (time.perf_counter() - t) * 1000, result


async def p50(client: Client, tool: str, args: dict[str, Any], calls: int) -> float:
    times = [(await timed(client, tool, args))[0] for _ in range(calls)]
    return statistics.median(times)


async def one_size(n: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="km-bench-ws-") as tmp:
        settings = Settings(data_dir=Path(tmp), pool_size=1, timeout=600, max_timeout=600)
        async with Client(create_server(settings)) as client:
            for sid in ("empty", "big"):
                await client.call_tool("run_code", {"code": "1", "session_id": sid})
            made = await client.call_tool("run_code", {"code": MAKE_FILES.format(n=n), "session_id": "big"})
            assert not made.is_error, made
            rows = []
            for label, tool, args in (
                ("python 1+1", "run_code", {"code": "1+1"}),
                ("bash true", "run_code", {"code": "true", "language": "bash"}),
            ):
                base = await p50(client, tool, {**args, "session_id": "empty"}, calls)
                big = await p50(client, tool, {**args, "session_id": "big"}, calls)
                rows.append((label, base, big))
            ms, changed = await timed(
                client, "run_code", {"code": "open('new.txt','w').write('x')", "session_id": "big"}
            )
            found = "new.txt" in str(changed.structured_content.get("files"))
            list_ms, listing = await timed(client, "list_files", {"session_id": "big"})
            chars = sum(len(getattr(c, "text", "")) for c in listing.content)
            deep = {"session_id": "big", "offset": n // 2, "limit": 200}
            page_ms = await p50(client, "list_files", deep, calls)
            edited = await client.call_tool(
                "run_code", {"code": "open('tree/d0/f7.txt','a').write('more')", "session_id": "big"}
            )
            in_place = [f["path"] for f in edited.structured_content.get("files", [])] == ["tree/d0/f7.txt"]
        print(f"\n## {n:,} files")
        print("| call | baseline p50 (no files) | big tree p50 | ratio |")
        print("|---|---|---|---|")
        for label, base, big in rows:
            print(f"| {label} | {base:.1f} ms | {big:.1f} ms | {big / base:.2f}× |")
        print(f"| call creating one file | | {ms:.1f} ms (new file listed: {found}) | |")
        print(f"| list_files | | {list_ms:.1f} ms, {chars:,} characters | |")
        print(f"| list_files, a page at offset {n // 2:,} (p50) | | {page_ms:.1f} ms | |")
        print(f"| call changing one file in place | | listed alone: {in_place} | |")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    for n in args.sizes:
        await one_size(n, args.calls)


if __name__ == "__main__":
    anyio.run(main)

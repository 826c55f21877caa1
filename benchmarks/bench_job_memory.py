"""Server memory after many finished background jobs with large results.

    python benchmarks/bench_job_memory.py [--jobs 120] [--mb 3.5]

One ``kernmind serve --transport http`` process (sandbox none, no embeddings). ``--jobs``
background jobs (in 4 sessions, at most 4 running at once) each display an HTML table of
about ``--mb`` MB; the baseline is the same number of jobs displaying a few bytes, on a
fresh server in the same run. After all jobs finished (and every result was read once with
job_status), the server's resident memory (VmRSS) is read from /proc. Finished jobs' results
live in their records on disk, not in the server: the two figures should be close.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

BIG = "from IPython.display import HTML, display\ndisplay(HTML('<td>x</td>' * {cells}))\n{n}"
SMALL = "from IPython.display import HTML, display\ndisplay(HTML('<td>x</td>'))\n{n}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(data: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = data.parent / f"{data.name}.log"
    argv = [
        sys.executable,
        "-m",
        "kernmind",
        "serve",
        "--transport",
        "http",
        "--port",
        "0",
        "--data-dir",
        str(data),
    ]
    argv += [
        "--sandbox",
        "none",
        "--embedding-model",
        "none",
        "--pool-size",
        "1",
        "--max-result-bytes",
        "8000000",
    ]
    # (the server inherits this environment: PYTHONPATH measures other code, MALLOC_* other settings)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if match := re.search(r"serving MCP on (http://\S+)", log.read_text(errors="replace")):
            return proc, match.group(1), log
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text())


async def run_jobs(url: str, code: str, jobs: int) -> None:
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(60.0, read=300.0))
    async with Client(streamable_http_client(url, http_client=http)) as client:
        for first in range(0, jobs, 4):
            ids = []
            for n in range(first, min(jobs, first + 4)):
                args = {"code": code.format(n=n), "session_id": f"s{n % 4}", "background": True}
                ids.append((await client.call_tool("run_code", args)).structured_content["job_id"])
            for job_id in ids:
                while True:
                    status = (await client.call_tool("job_status", {"job_id": job_id})).structured_content
                    if status["state"] != "running":
                        break
                    await anyio.sleep(0.2)


def measure(root: Path, name: str, code: str, jobs: int) -> tuple[float, float]:
    proc, url, _ = start(root / name)
    try:
        time.sleep(3)
        before = rss_mib(proc.pid)
        anyio.run(run_jobs, url, code, jobs)
        time.sleep(1)
        return before, rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--mb", type=float, default=3.5)
    args = parser.parse_args()
    cells = int(args.mb * 1e6 / len("<td>x</td>"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = measure(root, "small", SMALL, args.jobs)
        big = measure(root, "big", BIG.replace("{cells}", str(cells)), args.jobs)
    print(f"{args.jobs} finished jobs, server VmRSS before -> after (MiB)")
    print(f"  tiny results:            {base[0]:.0f} -> {base[1]:.0f}")
    print(f"  {args.mb:g} MB HTML each:     {big[0]:.0f} -> {big[1]:.0f}")
    print(f"  growth ratio (big/tiny): {(big[1] - big[0]) / max(1.0, base[1] - base[0]):.2f}")


if __name__ == "__main__":
    main()

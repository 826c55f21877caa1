"""A shared server under load: 8 principals making mixed calls while a ninth burns CPU.

    python benchmarks/bench_shared_load.py [--clients 8] [--calls 30] [--burners 1] [--sandbox auto]
        [--profile FILE] [--serve-arg=--flag --serve-arg=value ...]

One ``kernmind serve --transport http --tokens FILE`` (default settings otherwise); each
client is its own principal with its own token, connected through the SDK's client
(2026-07-28 era). Every client makes ``--calls`` calls in a row, cycling through a mix:
``run_code`` ``1+1`` in its own session, ``list_sessions``, ``memory_read``,
``memory_append``, ``archival_memory_insert``, ``archival_memory_search``, ``upload_file``
and ``list_files``; all clients run at once. Two rounds, in the same run:

- baseline: the clients alone;
- loaded: the same, while the ninth principal keeps ``--burners`` background jobs spinning
  (``while True: pass``, each a full core) and calls ``run_code`` with a CPU-bound loop of
  its own in a loop.

Before the rounds every client has its kernel warm (first call) and its memory open. It
prints p50, p95 and the largest latency per round, the number of errors (any tool error or
exception counts), the server process's own CPU per call (its kernels and sandboxes not
included: a figure that moves less with other load on the machine than latencies do), the
clients' own CPU per call (this process: the SDK client's work, which shares the cores), the
per-tool p50 and p95, and the loaded/baseline ratio of p95. The figure to keep: loaded p95
under 100 ms, no errors.

``--profile FILE`` samples the server process with py-spy (``pip install py-spy``; it needs
ptrace rights) during both rounds and writes its collapsed stacks to FILE, then prints the
functions the server spent most samples in (own time and with callees).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kernmind.tokens_file import TokenFile


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def start_server(
    data: Path, sandbox: str, tokens_file: Path, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    log = data / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}
    argv = [sys.executable, "-m", "kernmind", "serve", "--data-dir", str(data / "data"), "--sandbox", sandbox]
    argv += ["--transport", "http", "--port", "0", "--tokens", str(tokens_file), *extra]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = re.search(r"serving MCP on (http://\S+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(log.read_text(errors="replace"))


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` (all its threads) until it gets SIGINT."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [py_spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "-o", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def frame_name(frame: str) -> str:
    """``function (path/to/module.py:12)`` as ``function module.py`` (lines merged)."""
    function, _, where = frame.partition(" (")
    return f"{function} {where.rsplit('/', 1)[-1].split(':')[0]}"


def stop_profiler(proc: subprocess.Popen[bytes], out: Path, top: int = 25) -> None:
    """Stop py-spy and print where the samples fell: own time, then time with callees."""
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"  profile: {total} samples of the server process -> {out}")
    for title, table in (("own", own), ("with callees", inclusive)):
        print(f"    top {top}, {title}:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"      {n / max(total, 1) * 100:5.1f}%  {frame}")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process itself has used so far (not its kernels)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds this benchmark process (the clients) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Usage:
    """Wall time and CPU (server process, client process) over a round."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = (time.perf_counter(), process_cpu(pid), own_cpu())
        self.wall = self.server = self.client = 0.0

    def stop(self) -> Usage:
        wall, server, client = self.start
        self.wall = time.perf_counter() - wall
        self.server = process_cpu(self.pid) - server
        self.client = own_cpu() - client
        return self


def client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=300)
    )
    return Client(streamable_http_client(url, http_client=http), mode="auto")


Call = Callable[[], Awaitable[Any]]


def mix(c: Client, who: str) -> list[tuple[str, Call]]:
    def tool(name: str, arguments: dict[str, Any]) -> tuple[str, Call]:
        async def call() -> None:
            result = await c.call_tool(name, arguments)
            if result.is_error:
                raise RuntimeError(f"{name}: {result.content[0].text[:200]}")  # type: ignore[union-attr]

        return name, call

    return [
        tool("run_code", {"code": "1+1", "session_id": who}),
        tool("list_sessions", {}),
        tool("memory_read", {"label": "human"}),
        tool("memory_append", {"label": "human", "content": "x"}),
        tool("archival_memory_insert", {"content": f"{who} noted a fact at {time.time()}"}),
        tool("archival_memory_search", {"query": "fact noted"}),
        tool("upload_file", {"path": "note.txt", "content": "hello", "session_id": who}),
        tool("list_files", {"session_id": who}),
    ]


Times = dict[str, list[float]]  # tool -> latencies (s)


def every(times: Times) -> list[float]:
    return [t for values in times.values() for t in values]


async def one_round(clients: list[tuple[Client, str]], calls: int) -> tuple[Times, list[str]]:
    times: Times = {}
    errors: list[str] = []

    async def drive(c: Client, who: str) -> None:
        steps = mix(c, who)
        for i in range(calls):
            name, call = steps[i % len(steps)]
            t0 = time.perf_counter()
            try:
                await call()
            except Exception as exc:
                errors.append(f"{who} {name}: {exc}")
                continue
            times.setdefault(name, []).append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for c, who in clients:
            tg.start_soon(drive, c, who)
    return times, errors


async def burn(c: Client, stop: anyio.Event) -> int:
    """The ninth client: CPU-bound calls of its own, one after another, until ``stop``."""
    n = 0
    while not stop.is_set():
        await c.call_tool(
            "run_code", {"code": "sum(i * i for i in range(2_000_000))", "session_id": "burn-calls"}
        )
        n += 1
    return n


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        file = TokenFile(root / "tokens.json")
        names = [f"user{i}" for i in range(args.clients)]
        tokens = {name: file.add(name, []) for name in [*names, "burner"]}
        proc, url = start_server(root, args.sandbox, root / "tokens.json", args.serve_arg)
        try:
            async with AsyncExitStack() as stack:
                clients = [(await stack.enter_async_context(client(url, tokens[n])), n) for n in names]
                burner = await stack.enter_async_context(client(url, tokens["burner"]))
                t0 = time.perf_counter()
                await one_round(clients, len(mix(clients[0][0], "warm")))  # kernels warm, memory open
                print(f"warm-up: {time.perf_counter() - t0:.1f} s")
                profiler = start_profiler(proc.pid, args.profile) if args.profile else None
                usage = Usage(proc.pid)
                base, base_errors = await one_round(clients, args.calls)
                use_base = usage.stop()
                jobs = []
                for i in range(args.burners):
                    r = await burner.call_tool(
                        "run_code",
                        {"code": "while True: pass", "session_id": f"spin-{i}", "background": True},
                    )
                    jobs.append(r.structured_content["job_id"])  # type: ignore[index]
                await anyio.sleep(1)
                stop = anyio.Event()
                burned: list[int] = []
                async with anyio.create_task_group() as tg:

                    async def burner_task() -> None:
                        burned.append(await burn(burner, stop))

                    tg.start_soon(burner_task)
                    usage = Usage(proc.pid)
                    loaded, loaded_errors = await one_round(clients, args.calls)
                    use_loaded = usage.stop()
                    stop.set()
                if profiler is not None:
                    stop_profiler(profiler, args.profile)
                for job in jobs:
                    await burner.call_tool("job_cancel", {"job_id": job})
        finally:
            proc.terminate()
            proc.wait(60)
            if args.log is not None:
                shutil.copyfile(root / "server.log", args.log)
    load = os.getloadavg()[0]
    print(
        f"{args.clients} clients x {args.calls} mixed calls, sandbox {args.sandbox}, load average {load:.1f}"
    )
    rounds = (("baseline", base, base_errors, use_base), ("loaded", loaded, loaded_errors, use_loaded))
    for label, times, errors, use in rounds:
        flat = every(times)
        n = max(len(flat), 1)
        print(
            f"  {label:<9} n={len(flat):<4} p50 {statistics.median(flat) * 1000:6.1f} ms   "
            f"p95 {pct(flat, 0.95) * 1000:6.1f} ms   max {max(flat) * 1000:6.1f} ms   errors {len(errors)}   "
            f"server CPU {use.server / n * 1000:.1f} ms/call"
        )
        print(
            f"    round {use.wall:.2f} s ({len(flat) / use.wall:.0f} calls/s); clients' own CPU "
            f"{use.client / n * 1000:.1f} ms/call; server busy {use.server / use.wall * 100:.0f}% of one core"
        )
        for name, values in sorted(times.items()):
            print(
                f"    {name:<24} p50 {statistics.median(values) * 1000:6.1f} ms   p95 {pct(values, 0.95) * 1000:6.1f} ms"
            )
        for e in errors[:5]:
            print(f"    {e}")
    print(
        f"  burner: {args.burners} spinning job(s) and {burned[0] if burned else 0} CPU-bound calls meanwhile"
    )
    print(f"  loaded / baseline p95: {pct(every(loaded), 0.95) / pct(every(base), 0.95):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--burners", type=int, default=1, help="background jobs spinning a core each")
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "none"])
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for `kernmind serve` (repeatable)"
    )
    parser.add_argument("--log", type=Path, help="keep the server's log in this file")
    parser.add_argument("--profile", type=Path, help="sample the server with py-spy into this file")
    args = parser.parse_args()
    anyio.run(bench, args)


if __name__ == "__main__":
    main()

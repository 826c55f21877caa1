"""Fresh Python interpreters over a real stdio MCP client: the fork server against starting
kernels the normal way, measured in one run.

    python benchmarks/bench_fresh.py [--n 100] [--resets 30] [--idle 6] [--sandbox bwrap]

Rows (each for ``--fork-server`` and ``--no-fork-server``, default pool size):
- ``--stateless``: ``--n`` back-to-back ``1+1`` calls, amortized (total / n) and p50;
- the same with ``import pandas as pd`` in every call;
- ``--resets`` back-to-back ``reset: true`` calls on one session, amortized;
- as an agent calls (``--spaced`` calls, each ``--pause`` seconds after the last: a warm pool,
  as a model's thinking between calls leaves it): ``--stateless`` and ``reset: true`` p50, and
  their ratio to the stateful p50 (issue 37's rows);
- stateful ``1+1`` p50, against a raw ``jupyter_client`` round trip (no sandbox, no MCP);
- unique memory per extra idle kernel: ``--idle`` sessions, each with a kernel, on a server
  with no warm pool; the USS (and PSS) of every process of one kernel's sandbox, summed,
  averaged over the kernels. The template's own USS is shown apart: paid once.

Timing is wall clock on whatever else the machine is doing: read the ratios, and the CPU
rows (CPU seconds of the server and every process under it, per call), which depend far
less on other load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_python import pct, raw_floor

ONE = "1+1"
PANDAS = "import pandas as pd\n1+1"


def params(data_dir: str, fork: bool, sandbox: str, *extra: str) -> StdioServerParameters:
    # This environment (PYTHONPATH included: pointing it at another checkout's src measures
    # that code), without KERNMIND_* settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}
    return StdioServerParameters(
        env=env,
        command=sys.executable,
        args=["-m", "kernmind", "serve", "--data-dir", data_dir, "--sandbox", sandbox,
              "--fork-server" if fork else "--no-fork-server", "--log-level", "WARNING", *extra],
    )  # fmt: skip


async def call(client: Client, code: str, **kw: object) -> float:
    t = time.perf_counter()
    result = await client.call_tool("run_code", {"code": code, **kw})
    elapsed = time.perf_counter() - t
    out = result.structured_content
    assert out is not None and out["status"] == "ok", result
    return elapsed


async def settle(client: Client) -> None:
    """Until the warm pool is full: the template is up and no kernel is booting."""
    for _ in range(600):
        listed = (await client.call_tool("list_sessions", {})).structured_content or {}
        if listed.get("warm_kernels", 0) >= 2:
            break
        await anyio.sleep(0.1)
    await anyio.sleep(1.0)


async def back_to_back(client: Client, code: str, n: int, server: int, **kw: object) -> tuple[float, ...]:
    """(amortized, p50, CPU) seconds per call over ``n`` calls made one after the other; CPU
    is what the server and every process under it used, per call."""
    cpu = tree_cpu(server)
    t = time.perf_counter()
    times = [await call(client, code, **kw) for _ in range(n)]
    amortized = (time.perf_counter() - t) / n
    await anyio.sleep(1.0)  # let the last released kernels stop (their CPU counts too)
    return amortized, pct(times, 0.5), (tree_cpu(server) - cpu) / n


async def spaced(client: Client, code: str, n: int, pause: float, **kw: object) -> tuple[float, ...]:
    """p50 seconds of ``n`` calls, each ``pause`` seconds after the last one ended."""
    times = []
    for _ in range(n):
        await anyio.sleep(pause)
        times.append(await call(client, code, **kw))
    return pct(times, 0.5), pct(times, 0.5), 0.0


async def fresh_rows(
    fork: bool, sandbox: str, n: int, resets: int, spaced_n: int, pause: float
) -> dict[str, tuple[float, ...]]:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(params(tmp, fork, sandbox, "--stateless")) as client:
            await call(client, ONE)
            server = server_pid(tmp)
            await settle(client)
            rows["stateless"] = await back_to_back(client, ONE, n, server)
            await settle(client)
            rows["stateless pandas"] = await back_to_back(client, PANDAS, n, server)
            await settle(client)
            rows["stateless spaced"] = await spaced(client, ONE, spaced_n, pause)
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(params(tmp, fork, sandbox)) as client:
            await call(client, ONE, session_id="r")
            server = server_pid(tmp)
            await settle(client)
            rows["reset"] = await back_to_back(client, ONE, resets, server, session_id="r", reset=True)
            await settle(client)
            rows["reset spaced"] = await spaced(client, ONE, spaced_n, pause, session_id="r", reset=True)
            rows["stateful spaced"] = await spaced(client, ONE, spaced_n, pause, session_id="r")
            for _ in range(10):
                await call(client, ONE, session_id="s")
            times = [await call(client, ONE, session_id="s") for _ in range(max(n, 100))]
            rows["stateful"] = (pct(times, 0.5), pct(times, 0.5), 0.0)
    return rows


TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds used by ``pid`` and everything under it, alive or already reaped (a reaped
    process's time is in its parent's children times)."""
    total = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / TICK


def memory(pid: int) -> tuple[int, int]:
    """(USS, PSS) of a process in KiB."""
    uss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                uss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    except OSError:
        pass
    return uss, pss


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def server_pid(data_dir: str) -> int:
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmd and data_dir.encode() in cmd:
                return int(p)
    raise RuntimeError("server process not found")


PRELOAD_SECONDS = 6.0  # enough for the template's preloads on a busy 2-core machine


async def idle_memory(fork: bool, sandbox: str, kernels: int) -> dict[str, float]:
    """MiB per idle kernel (USS and PSS of all its processes), and the template's USS."""
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(params(tmp, fork, sandbox, "--pool-size", "0")) as client:
            # The template forks from its first half second but imports pandas & co. after that:
            # a kernel forked before they are in imports them itself. Measure the steady state.
            await anyio.sleep(PRELOAD_SECONDS)
            for i in range(kernels):
                await call(client, "import pandas as pd\n1+1", session_id=f"idle{i}")
            await anyio.sleep(2)
            server = server_pid(tmp)
            template = [
                p
                for p in children(server)
                if b"forkserver/template.py" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
            sandboxes = [  # prlimit→bwrap, one per kernel
                p for p in children(server) if b"bwrap" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
            if template:  # the forked kernels and their waiters hang off the template
                waiters = children(template[0])
            else:
                waiters = []
            per_kernel = [tree(p) for p in sandboxes]
            for i, waiter in enumerate(waiters[: len(per_kernel)]):
                per_kernel[i] = per_kernel[i] + tree(waiter)
            totals = [[memory(p) for p in procs] for procs in per_kernel]
            uss = sum(sum(u for u, _ in t) for t in totals) / len(totals) / 1024
            pss = sum(sum(s for _, s in t) for t in totals) / len(totals) / 1024
            return {
                "uss": uss,
                "pss": pss,
                "template_rss": rss(template[0]) / 1024 if template else 0.0,
                "kernels": len(totals),
            }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--resets", type=int, default=30)
    ap.add_argument("--idle", type=int, default=6)
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--spaced", type=int, default=10)
    ap.add_argument("--pause", type=float, default=1.0)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}")
    raw, _ = await raw_floor(200, 1)
    floor = pct(raw, 0.5)
    fork = await fresh_rows(True, args.sandbox, args.n, args.resets, args.spaced, args.pause)
    plain = await fresh_rows(False, args.sandbox, args.n, args.resets, args.spaced, args.pause)
    mem_fork = await idle_memory(True, args.sandbox, args.idle)
    mem_plain = await idle_memory(False, args.sandbox, args.idle)

    def ms(value: float) -> str:
        return f"{value * 1000:8.1f}"

    print(
        f"| figure ({args.sandbox}, stdio MCP)                  | fork server | normal start | normal / fork |"
    )
    print("|------------------------------------------------|-------------|--------------|---------------|")
    for key, label in (
        ("stateless", f"{args.n} x --stateless `1+1`, amortized ms"),
        ("stateless pandas", f"{args.n} x --stateless with pandas, amortized ms"),
        ("reset", f"{args.resets} x `reset: true`, amortized ms"),
    ):
        f, p = fork[key][0], plain[key][0]
        print(f"| {label:<46} | {ms(f):>11} | {ms(p):>12} | {p / f:12.1f}x |")
    for key, label in (
        ("stateless", "--stateless `1+1`, p50 ms"),
        ("reset", "`reset: true`, p50 ms"),
        ("stateless spaced", f"--stateless `1+1`, {args.pause:g} s apart, p50 ms"),
        ("reset spaced", f"`reset: true`, {args.pause:g} s apart, p50 ms"),
        ("stateful spaced", f"stateful `1+1`, {args.pause:g} s apart, p50 ms"),
    ):
        f, p = fork[key][1], plain[key][1]
        print(f"| {label:<46} | {ms(f):>11} | {ms(p):>12} | {p / f:12.1f}x |")
    for key, label in (
        ("stateless spaced", "  --stateless / stateful, spaced"),
        ("reset spaced", "  reset / stateful, spaced"),
    ):
        f, p = fork[key][1] / fork["stateful spaced"][1], plain[key][1] / plain["stateful spaced"][1]
        print(f"| {label:<46} | {f:10.2f}x | {p:11.2f}x |               |")
    for key, label in (
        ("stateless", "CPU per --stateless `1+1` call, ms"),
        ("stateless pandas", "CPU per --stateless pandas call, ms"),
        ("reset", "CPU per `reset: true` call, ms"),
    ):
        f, p = fork[key][2], plain[key][2]
        print(f"| {label:<46} | {ms(f):>11} | {ms(p):>12} | {p / f:12.1f}x |")
    f, p = fork["stateful"][0], plain["stateful"][0]
    print(f"| {'stateful `1+1` p50 ms':<46} | {ms(f):>11} | {ms(p):>12} | {p / f:12.2f}x |")
    print(f"| {'  vs raw jupyter_client floor (' + ms(floor).strip() + ' ms)':<46} | "
          f"{f / floor:10.2f}x | {p / floor:11.2f}x |               |")  # fmt: skip
    print(f"| {'USS per extra idle kernel, MiB':<46} | {mem_fork['uss']:11.1f} | {mem_plain['uss']:12.1f} | "
          f"{mem_plain['uss'] / mem_fork['uss']:12.1f}x |")  # fmt: skip
    print(f"| {'PSS per extra idle kernel, MiB':<46} | {mem_fork['pss']:11.1f} | {mem_plain['pss']:12.1f} | "
          f"{mem_plain['pss'] / mem_fork['pss']:12.1f}x |")  # fmt: skip
    print(
        f"| {'template RSS (once), MiB':<46} | {mem_fork['template_rss']:11.1f} | {'-':>12} |               |"
    )
    print(
        f"\nload average at the end: {os.getloadavg()[0]:.1f} (wall times stretch with it; CPU per call much less)"
    )
    print(f"targets: stateless amortized <= 100 ms (fork: {fork['stateless'][0] * 1000:.0f}); with pandas <= 150 "
          f"({fork['stateless pandas'][0] * 1000:.0f}); {args.resets} resets <= 100 ({fork['reset'][0] * 1000:.0f}); "
          f"stateful/floor <= 1.5x ({fork['stateful'][0] / floor:.2f}x); USS <= 30 MiB ({mem_fork['uss']:.1f})")  # fmt: skip


if __name__ == "__main__":
    anyio.run(main)

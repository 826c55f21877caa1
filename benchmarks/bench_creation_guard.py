"""What the creation guard costs: a round trip to its helper per creating call.

    python benchmarks/bench_creation_guard.py [--files 2000] [--rounds 5]

Real bubblewrap sandboxes started as a kernel's are (``Sandbox.wrap``), with and without
the guard (``guard=True``: the lifeline in front of bubblewrap answers it), interleaved
round by round so both see the same load. Inside, one Python creates ``--files`` empty files
in the workspace (``open(…, "w")``: ``O_CREAT``, a round trip each with the guard), then
opens each again for reading (no ``O_CREAT``: the filter lets it through without asking),
then removes them. Printed: the median per call of each, the ratio guard / none, and the
sandbox's start (``true``) with and without the guard's extra parent.

Then the same loop in real kernels, a fork-server kernel (the template's waiter answers) and
one started the normal way, each with and without the guard (a copy of the sandbox with
``guard=None``), interleaved.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import anyio

from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox

LOOP = r"""
import json, os, sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for i in range(n):
    open(f"f{i}", "w").close()
made = time.perf_counter() - t
t = time.perf_counter()
for i in range(n):
    open(f"f{i}").close()
read = time.perf_counter() - t
t = time.perf_counter()
for i in range(n):
    os.remove(f"f{i}")
removed = time.perf_counter() - t
print(json.dumps({"create_us": made / n * 1e6, "read_us": read / n * 1e6, "remove_us": removed / n * 1e6}))
"""


def run(sandbox: Sandbox, workspace: Path, argv: list[str], guard: bool) -> tuple[str, float]:
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(workspace, uid, uid)
    cmd = sandbox.wrap(argv, workspace=workspace, uid=uid, guard=guard)
    started = time.perf_counter()
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sandbox = Sandbox.detect("required")
    if sandbox.guard is None:
        raise SystemExit(f"no creation guard here: {sandbox.guard_problem}")
    python = "/usr/bin/python3"
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    starts: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="kernmind-bench-guard-") as tmp:
        for _ in range(args.rounds):
            for guard in (False, True):
                ws = Path(tmp) / f"ws-{guard}"
                ws.mkdir(exist_ok=True)
                out, _ = run(sandbox, ws, [python, "-c", LOOP, str(args.files)], guard)
                rows[guard].append(json.loads(out))
                _, elapsed = run(sandbox, ws, ["true"], guard)
                starts[guard].append(elapsed * 1000)

    def median(guard: bool, key: str) -> float:
        return statistics.median(r[key] for r in rows[guard])

    print(f"{args.files} files, {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}")
    print("| operation | none (µs/call) | guard (µs/call) | guard / none |")
    print("|---|---|---|---|")
    for key, name in (
        ("create_us", "create (`open(…, 'w')`)"),
        ("read_us", "open to read"),
        ("remove_us", "remove"),
    ):
        none, guarded = median(False, key), median(True, key)
        print(f"| {name} | {none:.1f} | {guarded:.1f} | {guarded / none:.2f} |")
    none_ms, guard_ms = statistics.median(starts[False]), statistics.median(starts[True])
    print(f"| sandbox start (`true`, ms) | {none_ms:.0f} | {guard_ms:.0f} | {guard_ms / none_ms:.2f} |")
    anyio.run(in_kernels, sandbox, args.files, args.rounds)


async def in_kernels(sandbox: Sandbox, files: int, rounds: int) -> None:
    """The loop in real kernels, forked and normal, with and without the guard."""
    code = f"import sys\nsys.argv = ['loop', '{files}']\n" + LOOP
    bare = dataclasses.replace(sandbox, guard=None, guard_problem="off for the benchmark")
    runtime = PythonRuntime.probe(None)
    per: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="kernmind-bench-guard-k-") as tmp:
        factories = {
            guard: KernelFactory.standalone(sb, runtime, Path(tmp) / str(guard))
            for guard, sb in ((False, bare), (True, sandbox))
        }
        forks = {guard: ForkKernelFactory(f, preload=()) for guard, f in factories.items()}
        async with forks[False].running(), forks[True].running():
            for fork in forks.values():
                assert await fork.server.settled(wait=120) is not None, fork.status()
            for _ in range(rounds):
                for how in ("forked", "normal"):
                    for guard in (False, True):
                        kernel = await (forks[guard].start() if how == "forked" else factories[guard].start())
                        try:
                            collector = OutputCollector(100_000)
                            await kernel.execute(code, collector, deadline=time.monotonic() + 300)
                            out = json.loads("".join(collector.logs().stdout).strip().splitlines()[-1])
                            per.setdefault((how, guard), []).append(out["create_us"])
                        finally:
                            await kernel.shutdown()
                            kernel.workspace.remove()
    print("| kernel | create, none (µs/call) | create, guard (µs/call) | guard / none |")
    print("|---|---|---|---|")
    for how in ("forked", "normal"):
        none, guarded = statistics.median(per[(how, False)]), statistics.median(per[(how, True)])
        print(f"| {how} | {none:.1f} | {guarded:.1f} | {guarded / none:.2f} |")


if __name__ == "__main__":
    main()

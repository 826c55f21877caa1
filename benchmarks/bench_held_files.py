"""What counting a session's unnamed files costs a call (``sandbox/held_files.py``).

    python benchmarks/bench_held_files.py [--n 300]

One sandboxed Python kernel (bubblewrap, started the normal way: a lifeline, bubblewrap and
the kernel), measured in the same run:

- a ``1+1`` execute round trip on that kernel (the floor of a call, without MCP);
- ``HeldFiles.bytes`` on the per-call path (every descriptor ``stat``-ed; the list of
  mappings remembered for ``MAPS_PERIOD``), and with ``fresh`` (the mappings read again:
  what the sampler and measurements off the event loop do);
- the session's processes listed from their tree (``tree_pids``), for scale.

Figures go to benchmarks/README.md ("held files").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.held_files import HeldFiles
from kernmind.execution.sandbox.limits import tree_pids


def p50_us(fn: Callable[[], object], n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


async def main(n: int) -> None:
    sandbox = Sandbox.detect("auto")
    factory = KernelFactory.standalone(sandbox, PythonRuntime.probe(None), Path(tempfile.mkdtemp()))
    kernel = await factory.start()
    try:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await kernel.execute("1+1", OutputCollector(10_000), deadline=time.monotonic() + 30)
            times.append(time.perf_counter() - t)
        call = statistics.median(times) * 1e6
        pids = tree_pids(kernel.root_pids())
        devices = {os.stat(kernel.workspace.root).st_dev}
        fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in pids)
        held = HeldFiles()
        per_call = p50_us(lambda: held.bytes(pids, devices), n)
        fresh = p50_us(lambda: held.bytes(pids, devices, fresh=True), n)
        walk = p50_us(lambda: tree_pids(kernel.root_pids()), n)
    finally:
        await kernel.shutdown()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{len(pids)} processes, {fds} descriptors; load {' '.join(load)}\n")
    print("| measure | p50 | vs a 1+1 round trip |\n|---|---|---|")
    print(f"| kernel `1+1` round trip (no MCP) | {call / 1000:.2f} ms | 1.00× |")
    print(f"| held files, per-call path | {per_call / 1000:.2f} ms | {per_call / call:.2f}× |")
    print(f"| held files, fresh (mappings read) | {fresh / 1000:.2f} ms | {fresh / call:.2f}× |")
    print(f"| the session's processes, walked | {walk / 1000:.2f} ms | {walk / call:.2f}× |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300)
    anyio.run(main, parser.parse_args().n)

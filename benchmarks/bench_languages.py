"""p50 latency of a trivial snippet per language, cold and warm, in one table.

    python benchmarks/bench_languages.py [--cold N] [--warm N] [--sandbox auto|bwrap|none]

What is measured (at the runner level, through the real sandbox, without MCP transport):
- cold: a fresh runner and a fresh workspace for every sample — for Java that includes
  starting its JShell host JVM; for the others it is the same process-per-call path.
- warm: repeated calls on one runner and one workspace (Java: the warm host).
- ``jshell (cold CLI)``: a plain ``jshell`` running the same snippet from a file, for the
  Java target: warm Java p50 must be ≤ 0.25× this.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from kernmind.config import Settings
from kernmind.execution.runners import Runner, discover
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rlimits import limits_from
from kernmind.execution.sandbox.workspace import Workspace


async def aclose(runners: dict[str, Runner]) -> None:
    for runner in runners.values():
        await runner.aclose()


SNIPPETS = {
    "javascript": "1 + 1",
    "typescript": "const n: number = 1 + 1;\nn",
    "r": "1 + 1",
    "java": "1 + 1",
    "bash": "echo 2",
}


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def bench(cold_n: int, warm_n: int, mode: str) -> int:
    root = Path(tempfile.mkdtemp(prefix="kernmind-bench-"))
    settings = Settings(data_dir=root, pool_size=0)
    sandbox = Sandbox.detect(mode, limits=limits_from(settings))

    def workspace() -> Workspace:
        ws = Workspace(root / f"ws-{time.monotonic_ns()}", owner_uid=sandbox.allocate_uid())
        ws.create()
        return ws

    rows: list[tuple[str, str, float, float]] = []
    for lang, code in SNIPPETS.items():
        runners = discover(sandbox, settings)
        if lang not in runners:
            print(f"{lang}: not installed, skipped", file=sys.stderr)
            continue
        version = runners[lang].version
        await aclose(runners)
        cold: list[float] = []
        for _ in range(cold_n):
            fresh = discover(sandbox, settings)
            t = time.perf_counter()
            res = await fresh[lang].run(code, workspace=workspace(), timeout=120, progress=None)
            cold.append(time.perf_counter() - t)
            assert res.status == "ok", res
            await aclose(fresh)
        runner_set = discover(sandbox, settings)
        runner = runner_set[lang]
        ws = workspace()
        await runner.run(code, workspace=ws, timeout=120, progress=None)  # warm-up
        warm: list[float] = []
        for _ in range(warm_n):
            t = time.perf_counter()
            res = await runner.run(code, workspace=ws, timeout=120, progress=None)
            warm.append(time.perf_counter() - t)
            assert res.status == "ok", res
        await aclose(runner_set)
        rows.append((lang, version, p50(cold), p50(warm)))

    jshell_cold = None
    if "java" in SNIPPETS and any(r[0] == "java" for r in rows):
        snippet = root / "snippet.jsh"
        snippet.write_text("System.out.println(1 + 1);\n/exit\n")
        samples = []
        for _ in range(max(3, cold_n)):
            t = time.perf_counter()
            await anyio.run_process(["jshell", "-q", str(snippet)], check=True)
            samples.append(time.perf_counter() - t)
        jshell_cold = p50(samples)
    shutil.rmtree(root, ignore_errors=True)

    print(f"sandbox: {sandbox.backend} ({sandbox.reason}); cold n={cold_n}, warm n={warm_n}")
    print(f"{'language':<12} {'runtime':<34} {'cold p50 ms':>12} {'warm p50 ms':>12}")
    for lang, version, c, w in rows:
        print(f"{lang:<12} {version:<34} {c:>12.1f} {w:>12.1f}")
    if jshell_cold is not None:
        print(f"{'jshell':<12} {'(cold CLI, outside the sandbox)':<34} {jshell_cold:>12.1f} {'':>12}")
        java_warm = next(w for lang, _, _, w in rows if lang == "java")
        ratio = java_warm / jshell_cold
        verdict = "OK" if ratio <= 0.25 else "OVER TARGET"
        print(f"java warm p50 / cold jshell = {ratio:.3f} (target ≤ 0.25): {verdict}")
        return 0 if ratio <= 0.25 else 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cold", type=int, default=5)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--sandbox", default="auto")
    args = parser.parse_args()
    sys.exit(anyio.run(bench, args.cold, args.warm, args.sandbox))


if __name__ == "__main__":
    main()

"""``kernmind doctor``: what this machine can run, checked for real.

It builds the same components the server builds (sandbox detection, kernel Python
probe, language runners), then starts one sandboxed kernel and runs ``1 + 1`` in it, and
(unless ``--no-fork-server``) starts the fork server and times a forked kernel.
The report goes to stdout as aligned text (or JSON with ``--json``). Exit status 0 means
``kernmind serve`` can run here (a kernel started and answered); 1 means it cannot, and
the report says why.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from kernmind import __version__
from kernmind.config import Settings
from kernmind.execution import runners as runners_mod
from kernmind.execution.executor import limits_from
from kernmind.execution.forkserver_kernels import describe as describe_fork_server
from kernmind.execution.forkserver_kernels import fork_server_report
from kernmind.execution.kernels import KernelFactory, PythonRuntime
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import Sandbox, SandboxUnavailable
from kernmind.memory.database import redacted_location


async def _live_check(sandbox: Sandbox, runtime: PythonRuntime) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernmind-doctor-") as tmp:
        factory = KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run")
        started = time.perf_counter()
        try:
            kernel = await factory.start()
        except Exception as exc:
            return {"ok": False, "error": str(exc)}
        start_s = time.perf_counter() - started
        try:
            collector = OutputCollector(1000)
            t0 = time.perf_counter()
            outcome = await kernel.execute("1 + 1", collector, deadline=time.monotonic() + 30)
            exec_ms = (time.perf_counter() - t0) * 1000
            value = collector.results[0].text if collector.results else None
        finally:
            await kernel.shutdown()
        ok = outcome.kind == "ok" and value == "2"
        return {
            "ok": ok,
            "kernel_start_s": round(start_s, 2),
            "execute_ms": round(exec_ms, 1),
            "value": value,
        }


async def _fork_check(sandbox: Sandbox, runtime: PythonRuntime, preload: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernmind-doctor-") as tmp:
        return await fork_server_report(
            KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run"), preload
        )


def gather(settings: Settings) -> dict[str, Any]:
    report: dict[str, Any] = {"kernmind": __version__, "python": sys.version.split()[0]}
    try:
        sandbox = Sandbox.detect(
            settings.sandbox, allow_network=settings.allow_network, limits=limits_from(settings)
        )
    except SandboxUnavailable as exc:
        report["sandbox"] = {"backend": None, "reason": str(exc)}
        report["ok"] = False
        return report
    report["sandbox"] = sandbox.describe()
    runtime = PythonRuntime.probe(str(settings.kernel_python) if settings.kernel_python else None)
    languages: dict[str, Any] = {
        "python": {
            "available": runtime.error is None,
            "runtime": runtime.executable,
            "version": runtime.version,
            "ipykernel": runtime.ipykernel,
            **({"problem": runtime.error} if runtime.error else {}),
        }
    }
    for name, runner in sorted(runners_mod.discover(sandbox, settings).items()):
        languages[name] = {"available": True, "version": runner.version}
    for name, hint in sorted(runners_mod.missing_runtimes(sandbox, settings).items()):
        languages.setdefault(name, {"available": False, "install": hint})
    report["languages"] = languages
    report["database"] = redacted_location(settings.db_location)
    report["workspaces"] = str(settings.workspaces_dir)
    report["agent"] = settings.agent
    report["pool_size"] = settings.pool_size
    report["stateless"] = settings.stateless
    report["live_test"] = anyio.run(_live_check, sandbox, runtime) if runtime.error is None else {"ok": False}
    report["fork_server"] = (
        anyio.run(_fork_check, sandbox, runtime, settings.preload)
        if settings.fork_server and runtime.error is None
        else {
            "active": False,
            "reason": "turned off (--no-fork-server)" if runtime.error is None else "no Python",
        }
    )
    report["ok"] = bool(report["live_test"].get("ok"))
    return report


def _print_text(report: dict[str, Any]) -> None:
    def line(key: str, value: object) -> None:
        print(f"{key:<14} {value}")

    line("kernmind", report["kernmind"])
    sb = report["sandbox"]
    line("sandbox", f"{sb.get('backend')} — {sb.get('reason')}")
    if sb.get("backend"):
        line("  network", sb["network"])
        line("  runs as", sb["runs_as"])
        line("  limits", ", ".join(f"{k}={v}" for k, v in sb["limits"].items()))
    for name, info in report.get("languages", {}).items():
        if info.get("available"):
            extra = f" (ipykernel {info['ipykernel']})" if name == "python" else ""
            line(f"{name}", f"ok  {info.get('version')}{extra}")
        else:
            line(f"{name}", f"missing — {info.get('install') or info.get('problem')}")
    if "database" in report:
        line("database", report["database"])
        line("workspaces", report["workspaces"])
        line("memory agent", report["agent"])
        line(
            "warm pool",
            f"{report['pool_size']} kernels" + (" (stateless mode)" if report["stateless"] else ""),
        )
    live = report.get("live_test", {})
    if live.get("ok"):
        line(
            "live test",
            f"ok — kernel started in {live['kernel_start_s']} s, 1 + 1 = 2 in {live['execute_ms']} ms",
        )
    else:
        line("live test", f"FAILED — {live.get('error', 'kernel unavailable')}")
    if "fork_server" in report:
        line("fork server", describe_fork_server(report["fork_server"]))
    print("\nready: kernmind serve can run here." if report["ok"] else "\nNOT READY: see the lines above.")


def doctor(settings: Settings, *, as_json: bool = False) -> int:
    report = gather(settings)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0 if report["ok"] else 1

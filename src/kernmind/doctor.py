"""``kernmind doctor``: what this machine can run, checked for real.

It builds the same components the server builds (sandbox detection, kernel Python
probe, language runners), then starts one sandboxed kernel and runs ``1 + 1`` in it
(with ``--kernel-gateway``: one kernel on the gateway, whose sandbox then guards Python).
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
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.executor import limits_from
from kernmind.execution.gateway_kernels import GatewayKernelFactory
from kernmind.execution.kernels import KernelFactory, PythonRuntime
from kernmind.execution.remote import RemoteKernels
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import Sandbox, SandboxUnavailable
from kernmind.memory.database import redacted_location


async def _live_check(factory: KernelFactory | GatewayKernelFactory) -> dict[str, Any]:
    """Start one kernel (local, or on the gateway) and ask it ``1 + 1``."""
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
        await kernel.workspace.aremove()
    ok = outcome.kind == "ok" and value == "2"
    return {
        "ok": ok,
        "kernel_start_s": round(start_s, 2),
        "execute_ms": round(exec_ms, 1),
        "value": value,
    }


async def _local_check(sandbox: Sandbox, runtime: PythonRuntime) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernmind-doctor-") as tmp:
        return await _live_check(KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run"))


async def _gateway_check(remote: RemoteKernels) -> dict[str, Any]:
    try:
        spec = await remote.kernelspec()
    except RuntimeUnavailable as exc:
        return {"ok": False, "error": str(exc)}
    remote.workspaces.open()
    return {**await _live_check(remote.factory), "kernel": spec.get("display_name")}


def _gateway_report(settings: Settings, remote: RemoteKernels) -> dict[str, Any]:
    return {
        "url": settings.kernel_gateway,
        "kernelspec": settings.kernel_gateway_kernel,
        "sandbox": "the gateway's (its kernels' containers or pods); bubblewrap guards the languages run here",
        "workspaces": str(remote.workspaces.root),
        "kernel_workspaces": remote.workspaces.kernel_root,
        "sessions": "shared by every replica through PostgreSQL"
        if remote.shared
        else "this server's own (a PostgreSQL --db shares them with other replicas)",
    }


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
    remote = RemoteKernels.from_settings(settings) if settings.kernel_gateway else None
    languages: dict[str, Any] = {
        "python": {
            "available": runtime.error is None,
            "runtime": runtime.executable,
            "version": runtime.version,
            "ipykernel": runtime.ipykernel,
            **({"problem": runtime.error} if runtime.error else {}),
        }
        if remote is None
        else {"available": True, "runtime": "kernel gateway", "version": remote.version}
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
    if remote is not None:
        report["kernel_gateway"] = _gateway_report(settings, remote)
        report["live_test"] = anyio.run(_gateway_check, remote)
    else:
        report["live_test"] = (
            anyio.run(_local_check, sandbox, runtime) if runtime.error is None else {"ok": False}
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
            extra = f" (ipykernel {info['ipykernel']})" if info.get("ipykernel") else ""
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
    gateway = report.get("kernel_gateway")
    if gateway:
        line("kernel gateway", f"{gateway['url']} (kernelspec {gateway['kernelspec']!r})")
        line("  sandbox", f"python runs in {gateway['sandbox']}")
        line("  files", f"{gateway['workspaces']} (the kernels see it at {gateway['kernel_workspaces']})")
        line("  sessions", gateway["sessions"])
    live = report.get("live_test", {})
    if live.get("ok"):
        where = " on the gateway" if gateway else ""
        line(
            "live test",
            f"ok — kernel started{where} in {live['kernel_start_s']} s, 1 + 1 = 2 in {live['execute_ms']} ms",
        )
    else:
        line("live test", f"FAILED — {live.get('error', 'kernel unavailable')}")
    print("\nready: kernmind serve can run here." if report["ok"] else "\nNOT READY: see the lines above.")


def doctor(settings: Settings, *, as_json: bool = False) -> int:
    report = gather(settings)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0 if report["ok"] else 1

"""``kernmind doctor``: what this machine can run, checked for real (one sandboxed kernel runs
``1 + 1``, a forked kernel is timed). Exit status 0 means ``kernmind serve`` can run here.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from kernmind import __version__
from kernmind.config import Settings
from kernmind.db_location import redacted_location
from kernmind.execution import runners as runners_mod
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.forkserver.kernels import describe as describe_fork_server
from kernmind.execution.kernels.forkserver.kernels import fork_server_report
from kernmind.execution.kernels.gateway.kernels import GatewayKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import PackageInstaller, PythonTarget
from kernmind.execution.remote import RemoteKernels
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import host_mounts, volume
from kernmind.execution.sandbox.bwrap import Sandbox, SandboxUnavailable
from kernmind.execution.sandbox.cgroups import DEFAULT_CPU_WEIGHT, CgroupsUnavailable, CgroupSupport
from kernmind.execution.sandbox.rlimits import limits_from
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.embeddings import EmbeddingUnavailable, LocalEmbedder


async def _live_check(factory: KernelFactory | GatewayKernelFactory, gpu: bool) -> dict[str, Any]:
    """Start one kernel (local, or on the gateway) and ask it ``1 + 1`` (and, with GPUs, what CUDA sees)."""
    started = time.perf_counter()
    try:
        kernel = await factory.start()
    except Exception as exc:
        return {"ok": False, "error": str(exc)}
    start_s = time.perf_counter() - started
    group = getattr(kernel, "group", None)
    in_group = {"in_control_group": bool(group.pids())} if group is not None else {}
    try:
        collector = OutputCollector(1000)
        t0 = time.perf_counter()
        outcome = await kernel.execute("1 + 1", collector, deadline=time.monotonic() + 30)
        exec_ms = (time.perf_counter() - t0) * 1000
        value = collector.results[0].text if collector.results else None
        gpus = await _gpus_seen(kernel) if gpu else None
    finally:
        await kernel.shutdown()
        await kernel.workspace.aremove()
    ok = outcome.kind == "ok" and value == "2"
    return {
        "ok": ok,
        "kernel_start_s": round(start_s, 2),
        "execute_ms": round(exec_ms, 1),
        "value": value,
        **in_group,
        **({"cuda_devices_in_sandbox": gpus} if gpus is not None else {}),
    }


async def _local_check(sandbox: Sandbox, runtime: PythonRuntime, cgroups: CgroupSupport) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernmind-doctor-") as tmp:
        factory = KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run", cgroups=cgroups)
        return await _live_check(factory, sandbox.gpu is not None)


def _limits_report(settings: Settings) -> tuple[dict[str, Any], CgroupSupport]:
    """Which limits hold a session: a control group (v2 or v1) per session, or per-process rlimits."""
    try:
        cgroups = CgroupSupport.detect(settings.cgroups, cpu_weight=DEFAULT_CPU_WEIGHT)
    except CgroupsUnavailable as exc:
        return {"mode": "none", "reason": str(exc), "ok": False}, CgroupSupport.disabled(str(exc))
    if cgroups.active:
        enforced = (
            f"per session: memory {settings.memory_mb} MiB (its processes with its /tmp and /dev/shm), "
            f"{settings.max_processes} processes"
        )
        if cgroups.cpu_dir is not None:
            enforced += "; all sandboxes together weigh on the CPU as much as one process group"
    else:
        enforced = (
            f"per process only: RLIMIT_DATA {settings.memory_mb} MiB, RLIMIT_NPROC {settings.max_processes}; "
            "/tmp and /dev/shm are not counted, so a session can use more"
        )
    return {**cgroups.describe(), "enforced": enforced}, cgroups


async def _gateway_check(remote: RemoteKernels) -> dict[str, Any]:
    try:
        spec = await remote.kernelspec()
    except RuntimeUnavailable as exc:
        return {"ok": False, "error": str(exc)}
    remote.workspaces.open()
    return {**await _live_check(remote.factory, False), "kernel": spec.get("display_name")}


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


CUDA_COUNT = """
import ctypes
try:
    _cuda = ctypes.CDLL("libcuda.so.1")
    _n = ctypes.c_int()
    _r = _cuda.cuInit(0) or _cuda.cuDeviceGetCount(ctypes.byref(_n))
    _seen = _n.value if _r == 0 else f"CUDA error {_r}"
except OSError as _e:
    _seen = f"libcuda not loadable: {_e}"
_seen
"""


async def _gpus_seen(kernel: Any) -> str:
    collector = OutputCollector(1000)
    await kernel.execute(CUDA_COUNT, collector, deadline=time.monotonic() + 60)
    return (
        collector.results[0].text
        if collector.results
        else (collector.error.value if collector.error else "?")
    )


async def _fork_check(sandbox: Sandbox, runtime: PythonRuntime, preload: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernmind-doctor-") as tmp:
        return await fork_server_report(
            KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run"), preload
        )


def gather(settings: Settings) -> dict[str, Any]:
    report: dict[str, Any] = {"kernmind": __version__, "python": sys.version.split()[0]}
    try:
        sandbox = Sandbox.detect(
            settings.sandbox,
            allow_network=settings.allow_network,
            limits=limits_from(settings),
            gpu=settings.gpu,
        )
    except SandboxUnavailable as exc:
        report["sandbox"] = {"backend": None, "reason": str(exc)}
        report["ok"] = False
        return report
    try:  # --mount folders: listed under the sandbox (host_mounts.py)
        sandbox.host_mounts = host_mounts.parse_all(settings.mount, settings.data_dir)
    except host_mounts.MountError as exc:
        report["mount_problem"] = str(exc)
        report["ok"] = False
    report["sandbox"] = sandbox.describe()
    report["session_limits"], cgroups = _limits_report(settings)
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
    report["packages"] = _packages(settings, sandbox, runtime)
    report["database"] = redacted_location(settings.db_location)
    report["meaning_search"] = anyio.run(_meaning_check, settings)
    report["workspaces"] = str(settings.workspaces_dir)
    report["workspace_fs"] = volume.describe(
        settings.workspace_fs, settings.workspace_mb, settings.workspace_files, settings.data_dir
    )
    report["agent"] = settings.agent
    report["pool_size"] = settings.pool_size
    report["stateless"] = settings.stateless
    if remote is not None:
        report["kernel_gateway"] = _gateway_report(settings, remote)
        report["live_test"] = anyio.run(_gateway_check, remote)
    else:
        try:
            report["live_test"] = (
                anyio.run(_local_check, sandbox, runtime, cgroups) if runtime.error is None else {"ok": False}
            )
        finally:
            cgroups.close()
        report["fork_server"] = (
            anyio.run(_fork_check, sandbox, runtime, settings.preload)
            if settings.fork_server and runtime.error is None
            else {
                "active": False,
                "reason": "turned off (--no-fork-server)" if runtime.error is None else "no Python",
            }
        )
    report["ok"] = (
        bool(report["live_test"].get("ok"))
        and report["session_limits"].get("ok", True)
        and "mount_problem" not in report
    )
    return report


async def _meaning_check(settings: Settings) -> dict[str, Any]:
    """Which model ranks memory by meaning, and whether it loads and embeds here (a local model is
    tried; an endpoint is not called). A failure does not make kernmind unready: search falls back
    to full text."""
    embedder = make_embedder(settings)
    if embedder is None:
        return {"model": None, "reason": "turned off (--embedding-model none): full text only"}
    if not isinstance(embedder, LocalEmbedder):
        await embedder.aclose()
        return {"model": embedder.model, "endpoint": settings.embedding_base_url or "OpenAI"}
    try:
        started = time.perf_counter()
        await embedder.ready()
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        await embedder.embed(["Maria adopted a puppy from the shelter last weekend."])
        embed = time.perf_counter() - started
    except EmbeddingUnavailable as exc:
        return {"model": embedder.model, "ok": False, "problem": str(exc)}
    return {
        "model": embedder.model,
        "ok": True,
        "load_s": round(loaded, 2),
        "embed_ms": round(embed * 1000, 1),
    }


def _packages(settings: Settings, sandbox: Sandbox, runtime: PythonRuntime) -> dict[str, Any]:
    """install_packages' policy and sources, and what the kernel's Python can import now."""
    target = PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath)
    try:
        info = PackageInstaller.from_settings(settings, sandbox, target, os.environ).describe()
    except ValueError as exc:  # an unreadable allow-list
        info = {"mode": settings.packages, "problem": str(exc)}
    return {**info, "importable": list(runtime.notable)}


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
        line("  disk quota", sb["quota"])
        line("  quota counts", sb.get("quota_counts"))
        line("  io_uring", sb.get("io_uring"))
        line("  create guard", sb.get("creation_guard"))
        gpu = sb.get("gpu")
        line("  gpu", f"{len(gpu['devices'])} NVIDIA device(s) passed through" if gpu else "none")
        for problem in gpu["problems"] if gpu else []:
            line("  gpu problem", problem)
        for mount in sb.get("mounts") or []:
            line("  mount", mount)
    if report.get("mount_problem"):
        line("  mount", f"REFUSED — {report['mount_problem']}")
    if limits := report.get("session_limits"):
        mode = {"v2": "cgroup v2", "v1": "cgroup v1"}.get(str(limits["mode"]), "no control groups")
        line("session limits", f"{mode} — {limits['reason']}")
        if "enforced" in limits:
            line("  enforced", limits["enforced"])
    for name, info in report.get("languages", {}).items():
        if info.get("available"):
            extra = f" (ipykernel {info['ipykernel']})" if info.get("ipykernel") else ""
            line(f"{name}", f"ok  {info.get('version')}{extra}")
        else:
            line(f"{name}", f"missing — {info.get('install') or info.get('problem')}")
    if packages := report.get("packages"):
        detail = packages.get("problem") or f"{packages['sources']}; sdists {packages['sdist']}"
        line("packages", f"{packages['mode']} — {detail}")
        if "installer" in packages:
            line("  installer", f"{packages['installer']}; npm {packages['npm']}; proxy {packages['proxy']}")
            line("  trusts", packages["trusted certificates"])
        line("  importable", ", ".join(packages["importable"]) or "no notable packages")
    if "database" in report:
        line("database", report["database"])
        line("workspaces", report["workspaces"])
        line("  disk limit", report["workspace_fs"])
        line("memory agent", report["agent"])
        line("meaning search", describe_meaning_search(report["meaning_search"]))
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
        inside = " inside its control group" if live.get("in_control_group") else ""
        line(
            "live test",
            f"ok — kernel started{where}{inside} in {live['kernel_start_s']} s, 1 + 1 = 2 in {live['execute_ms']} ms",
        )
        if "cuda_devices_in_sandbox" in live:
            line("  cuda", f"devices seen inside the sandbox: {live['cuda_devices_in_sandbox']}")
    else:
        line("live test", f"FAILED — {live.get('error', 'kernel unavailable')}")
    if "fork_server" in report:
        line("fork server", describe_fork_server(report["fork_server"]))
    print("\nready: kernmind serve can run here." if report["ok"] else "\nNOT READY: see the lines above.")


def describe_meaning_search(info: dict[str, Any]) -> str:
    if info["model"] is None:
        return info["reason"]
    if "endpoint" in info:
        return f"{info['model']} at {info['endpoint']} (not called by doctor)"
    if not info["ok"]:
        return f"UNAVAILABLE — {info['problem']} (searches rank by full text)"
    return f"ok — {info['model']} loaded in {info['load_s']} s, a note embeds in {info['embed_ms']} ms"


def doctor(settings: Settings, *, as_json: bool = False) -> int:
    if settings.log_level == "INFO":  # the report says what the components' routine lines would,
        logging.getLogger("kernmind").setLevel(logging.WARNING)  # and they came after its last line
    report = gather(settings)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0 if report["ok"] else 1

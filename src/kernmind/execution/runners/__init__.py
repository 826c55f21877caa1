"""Language runners: Python (Jupyter kernels) and, as a process per call, JavaScript and
TypeScript (Deno), R, Java (warm JShell hosts) and bash.

The interface every runner implements is documented once, in ``base.py``. This module
finds the process runners whose runtime is installed:

- ``discover(sandbox, settings) -> dict[str, Runner]``: the runners whose runtime is
  installed (a missing runtime is simply absent, so the tool's language enum leaves it out).
- ``missing_runtimes(sandbox, settings) -> dict[str, str]``: language -> what to install.

Python's runner (``python.py``) needs the kernel pool, so the executor builds it.
Probing runs each runtime's ``--version`` once per process (cached by name), so creating
many servers in one process stays cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kernmind.config import Settings
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.runners.base import Runner
from kernmind.execution.runners.bash import BashRunner
from kernmind.execution.runners.core import Context
from kernmind.execution.runners.java import JavaRunner
from kernmind.execution.runners.javascript import DenoRunner
from kernmind.execution.runners.r import RRunner
from kernmind.execution.sandbox import Sandbox

LANGUAGES = ("javascript", "typescript", "r", "java", "bash")

__all__ = ["LANGUAGES", "Runner", "discover", "missing_runtimes"]

_probe_lock = threading.Lock()
_probe_cache: dict[str, object] = {}


def _probe_once(name: str, probe: Callable[[], object]) -> object:
    """Run a runtime's version probe once per process; later calls reuse what it found."""
    with _probe_lock:
        if name not in _probe_cache:
            _probe_cache[name] = probe()
        return _probe_cache[name]


def _probe_all(
    sandbox: Sandbox, settings: Settings, guard: SandboxGuard | None = None
) -> tuple[dict[str, Runner], dict[str, str]]:
    ctx = Context(sandbox, settings, guard)
    found: dict[str, Runner] = {}
    missing: dict[str, str] = {}

    def versions(name: str, cls: type) -> object:
        # Cache only what the probe learnt (binary paths, version), not the runner itself.
        got = _probe_once(name, lambda: cls.probe(ctx))
        return got

    deno = versions("deno", DenoRunner)
    if isinstance(deno, str):
        missing["javascript"] = missing["typescript"] = deno
    else:
        js, ts = deno  # type: ignore[misc]
        found["javascript"] = DenoRunner(ctx, "javascript", js.binary, js.version)
        found["typescript"] = DenoRunner(ctx, "typescript", ts.binary, ts.version)
    r = versions("r", RRunner)
    if isinstance(r, str):
        missing["r"] = r
    else:
        found["r"] = RRunner(ctx, r.binary, r.version)  # type: ignore[attr-defined]
    java = versions("java", JavaRunner)
    if isinstance(java, str):
        missing["java"] = java
    else:
        found["java"] = JavaRunner(ctx, java.java, java.javac, java.version)  # type: ignore[attr-defined]
    bash = versions("bash", BashRunner)
    if isinstance(bash, str):
        missing["bash"] = bash
    else:
        found["bash"] = BashRunner(ctx, bash.binary, bash.version)  # type: ignore[attr-defined]
    return found, missing


def discover(sandbox: Sandbox, settings: Settings, guard: SandboxGuard | None = None) -> dict[str, Runner]:
    """Runners for every language whose runtime is installed (fresh instances per call)."""
    return _probe_all(sandbox, settings, guard)[0]


def missing_runtimes(sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    """Language -> what to install, for every language whose runtime is missing."""
    return _probe_all(sandbox, settings)[1]

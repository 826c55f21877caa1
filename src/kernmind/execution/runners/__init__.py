"""Runners for languages other than Python: JavaScript/TypeScript (Deno), R, Java, bash.

Interface the executor (and ``doctor``) rely on:

- ``discover(sandbox, settings) -> dict[str, Runner]``: the runners whose runtime is
  installed (a missing runtime is simply absent, so the tool's language enum leaves it out).
- ``missing_runtimes(sandbox, settings) -> dict[str, str]``: language -> what to install.
- ``Runner.language``, ``Runner.version`` (a human-readable runtime version for doctor),
  ``await Runner.run(code, workspace=..., timeout=..., progress=...) -> RunResult``.
- ``await aclose(runners)``: stops what runners keep alive between calls (Java's warm
  JShell hosts). Call it when the server stops; it is safe to call more than once.

Every runner is one module (``bash``, ``javascript``, ``r``, ``java``) over a shared core
(``core``): sandboxed process, streaming output into the per-call budget, a time limit that
kills the whole process tree, helper files that never show up in ``files``, the same
``RunResult`` shape as Python.

Probing runs each runtime's ``--version`` once per process (cached by sandbox backend and
settings that matter), so creating many servers in one process stays cheap.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from kernmind.config import Settings
from kernmind.execution.results import RunResult
from kernmind.execution.runners.bash import BashRunner
from kernmind.execution.runners.core import Context
from kernmind.execution.runners.java import JavaRunner
from kernmind.execution.runners.javascript import DenoRunner
from kernmind.execution.runners.r import RRunner
from kernmind.execution.sandbox import Sandbox
from kernmind.execution.workspace import Workspace

Progress = Callable[[str, float], Awaitable[None]]

LANGUAGES = ("javascript", "typescript", "r", "java", "bash")

__all__ = ["LANGUAGES", "Progress", "Runner", "aclose", "discover", "missing_runtimes"]


@runtime_checkable
class Runner(Protocol):
    language: str
    version: str

    async def run(
        self, code: str, *, workspace: Workspace, timeout: float, progress: Progress | None
    ) -> RunResult: ...


_probe_lock = threading.Lock()
_probe_cache: dict[str, object] = {}


def _probe_once(name: str, probe: Callable[[], object]) -> object:
    """Run a runtime's version probe once per process; later calls reuse what it found."""
    with _probe_lock:
        if name not in _probe_cache:
            _probe_cache[name] = probe()
        return _probe_cache[name]


def _probe_all(sandbox: Sandbox, settings: Settings) -> tuple[dict[str, Runner], dict[str, str]]:
    ctx = Context(sandbox, settings)
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


def discover(sandbox: Sandbox, settings: Settings) -> dict[str, Runner]:
    """Runners for every language whose runtime is installed (fresh instances per call)."""
    return _probe_all(sandbox, settings)[0]


def missing_runtimes(sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    """Language -> what to install, for every language whose runtime is missing."""
    return _probe_all(sandbox, settings)[1]


async def aclose(runners: dict[str, Runner]) -> None:
    """Stop whatever the runners keep alive between calls (warm JShell hosts)."""
    for runner in runners.values():
        close = getattr(runner, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()

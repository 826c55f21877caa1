"""Language runners: Python (kernels, built by the executor) and process runners for JavaScript
and TypeScript (Deno), R, Java (warm JShell hosts) and bash; the interface is ``base.py``.

``discover``/``missing_runtimes`` say which runtimes are installed; each ``--version`` probe runs
once per process, and ``prefetch()`` starts them on a thread so they overlap the MCP SDK's import.
"""

from __future__ import annotations

import threading

from kernmind.config import Settings
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.runners.base import Runner
from kernmind.execution.runners.bash import BashRunner
from kernmind.execution.runners.core import Context
from kernmind.execution.runners.java import JavaRunner
from kernmind.execution.runners.javascript import DenoRunner
from kernmind.execution.runners.r import RRunner
from kernmind.execution.sandbox.bwrap import Sandbox

LANGUAGES = ("javascript", "typescript", "r", "java", "bash")

__all__ = ["LANGUAGES", "Runner", "discover", "missing_runtimes", "prefetch"]

# What each runtime's probe learnt: the runner's constructor arguments, or what to install.
Probed = dict[str, str] | str
PROBES: dict[str, type[BashRunner | DenoRunner | JavaRunner | RRunner]] = {
    "deno": DenoRunner,
    "r": RRunner,
    "java": JavaRunner,
    "bash": BashRunner,
}

_probe_lock = threading.Lock()
_probe_cache: dict[str, Probed] = {}


def _probe_once(name: str) -> Probed:
    """Run a runtime's version probe once per process; later calls reuse what it found."""
    with _probe_lock:
        if name not in _probe_cache:
            _probe_cache[name] = PROBES[name].probe()
        return _probe_cache[name]


def prefetch() -> None:
    """Probe every runtime on a daemon thread now; ``discover`` then finds the answers (or
    waits for the probe still running)."""

    def probe_all() -> None:
        for name in PROBES:
            _probe_once(name)

    threading.Thread(target=probe_all, name="kernmind-runtime-probes", daemon=True).start()


def _probe_all(
    sandbox: Sandbox, settings: Settings, guard: SandboxGuard | None = None
) -> tuple[dict[str, Runner], dict[str, str]]:
    ctx = Context(sandbox, settings, guard)
    found: dict[str, Runner] = {}
    missing: dict[str, str] = {}
    deno = _probe_once("deno")
    if isinstance(deno, str):
        missing["javascript"] = missing["typescript"] = deno
    else:
        found["javascript"] = DenoRunner(ctx, "javascript", deno["binary"], deno["version"])
        found["typescript"] = DenoRunner(
            ctx, "typescript", deno["binary"], f"{deno['version']}, {deno['typescript']}"
        )
    for language in ("r", "java", "bash"):  # (their probes are named after them)
        got = _probe_once(language)
        if isinstance(got, str):
            missing[language] = got
        else:
            found[language] = PROBES[language](ctx, **got)  # type: ignore[arg-type]
    return found, missing


def discover(sandbox: Sandbox, settings: Settings, guard: SandboxGuard | None = None) -> dict[str, Runner]:
    """Runners for every language whose runtime is installed (fresh instances per call)."""
    return _probe_all(sandbox, settings, guard)[0]


def missing_runtimes(sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    """Language -> what to install, for every language whose runtime is missing."""
    return _probe_all(sandbox, settings)[1]

"""Start-up probes, started before they are needed.

``kernmind serve`` spends its first second importing the MCP SDK, on one core. The probes
the executor needs before it can list its tools (is bubblewrap usable, which language
runtimes are installed and their versions: ``java -version`` alone starts a JVM) mostly wait
on child processes, so ``prefetch(settings)`` starts them on daemon threads first;
``Sandbox.detect`` and ``runners.discover`` then find their outcomes, or wait for the probe
still running. Nothing here changes what is probed or decided, only when. (``serve`` then
builds the executor and launches the fork-server template, and only then imports the SDK:
serving.py.)
"""

from __future__ import annotations

from kernmind.config import Settings
from kernmind.execution import runners
from kernmind.execution.sandbox.bwrap import Limits, Sandbox


def limits_from(settings: Settings) -> Limits:
    return Limits(
        memory_mb=settings.memory_mb,
        cpu_seconds=settings.cpu_seconds,
        max_processes=settings.max_processes,
        max_file_mb=settings.max_file_mb,
        max_open_files=settings.max_open_files,
    )


def prefetch(settings: Settings) -> None:
    """Start the sandbox and runtime probes on background threads."""
    Sandbox.prefetch(settings.sandbox, allow_network=settings.allow_network, limits=limits_from(settings))
    runners.prefetch()

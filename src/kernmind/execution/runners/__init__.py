"""Subprocess runners for languages other than Python (one process per call).

Placeholder until the languages issue lands: ``discover`` finds no runtimes.
Interface the executor relies on:

- ``discover(sandbox, settings) -> dict[str, Runner]``: the runners whose runtime is installed.
- ``missing_runtimes(sandbox, settings) -> dict[str, str]``: language -> what to install.
- ``Runner.language``, ``Runner.version`` (for doctor), and
  ``await Runner.run(code, workspace=..., timeout=..., progress=...) -> RunResult``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from kernmind.config import Settings
from kernmind.execution.results import RunResult
from kernmind.execution.sandbox import Sandbox
from kernmind.execution.workspace import Workspace

Progress = Callable[[str, float], Awaitable[None]]

LANGUAGES = ("javascript", "typescript", "r", "java", "bash")


class Runner(Protocol):
    language: str
    version: str

    async def run(
        self, code: str, *, workspace: Workspace, timeout: float, progress: Progress | None
    ) -> RunResult: ...


def discover(sandbox: Sandbox, settings: Settings) -> dict[str, Runner]:
    return {}


def missing_runtimes(sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    return {lang: "not implemented yet" for lang in LANGUAGES}

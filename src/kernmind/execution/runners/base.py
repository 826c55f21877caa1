"""The interface every language runner implements.

A runner runs one language and knows nothing of time limits, quotas, progress or result shapes
(the supervisor's):
- ``execute(call)``: run ``call.code``, output and the code's own error into ``call.collector``;
  cancelled, it leaves no process behind. With ``prepares``, ``call.begin()`` marks where the
  code itself starts (the time limit counts from there).
- ``interrupt(call)``: after a cancellation: True when state survived, False when lost, None
  when the runner keeps none.
- ``settle(call)``: after every call, shielded (replace a broken interpreter).
- ``release(session)``, ``aclose()``: the session closes, the server stops.

State lives in ``session.state[language]``. A runtime that cannot start raises
``RuntimeUnavailable`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.results import OutputCollector

__all__ = ["Call", "Runner", "RuntimeUnavailable", "StatelessRunner"]

if TYPE_CHECKING:
    from kernmind.execution.sandbox.workspace import Workspace
    from kernmind.execution.sessions.session import Session


@dataclass
class Call:
    """One run_code call, as runners see it."""

    code: str
    session: Session
    collector: OutputCollector
    timeout: float
    reset: bool = False
    notes: list[str] = field(default_factory=list)
    execution_count: int | None = None
    # Set by a runner when the call ended the session's state by itself (a dead kernel).
    state_preserved: bool | None = None
    on_begin: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def begin(self) -> None:
        """The code starts running now (the interpreter is ready)."""
        for callback in self.on_begin:
            callback()

    @property
    def workspace(self) -> Workspace:
        """The session's working directory (created when the session has none yet)."""
        return self.session.files()


@runtime_checkable
class Runner(Protocol):
    language: str
    version: str

    async def execute(self, call: Call) -> None: ...

    async def interrupt(self, call: Call) -> bool | None: ...

    async def settle(self, call: Call) -> None: ...

    async def release(self, session: Session) -> None: ...

    async def aclose(self) -> None: ...


class StatelessRunner:
    """Defaults for runners that start a process per call and keep nothing between calls."""

    language: str
    version: str

    async def interrupt(self, call: Call) -> bool | None:
        return None  # the process tree is killed when execute() is cancelled

    async def settle(self, call: Call) -> None:
        return None

    async def release(self, session: Session) -> None:
        return None

    async def aclose(self) -> None:
        return None

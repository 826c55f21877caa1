"""The interface every language runner implements, documented once.

A runner knows how to run code of one language and nothing about time limits, quotas,
progress or result shapes: the supervisor (``execution/supervisor.py``) owns those for
every language alike. One ``run_code`` call is a ``Call``; the supervisor hands it to the
runner and the runner:

- ``execute(call)``: runs ``call.code`` with the session's working directory, streaming
  output into ``call.collector`` and putting the code's own error (an exception, a
  non-zero exit) there too. It returns when the code finished. The supervisor may cancel
  it (time limit, workspace quota, the client, ``close_session``); the runner then only
  has to leave no process behind. A runner that first has to get an interpreter ready
  (a kernel from the pool) sets ``prepares = True`` and calls ``call.begin()`` when the
  code itself starts: the time limit and progress count from there.
- ``interrupt(call)``: after such a cancellation, stop the code. Returns True when the
  session's state survived (Python: the kernel went idle), False when state was lost
  (the interpreter had to be replaced), None when the runner keeps no state (a process
  per call: the process tree was killed).
- ``settle(call)``: after every call, shielded from cancellation: housekeeping such as
  replacing a broken interpreter before the next call.
- ``release(session)``: the session is closing: stop what the runner keeps for it.
- ``aclose()``: the server is stopping.

Runners keep per-session state in ``session.state[language]`` (Python: its kernel).
A runner that cannot start its runtime raises ``RuntimeUnavailable`` with the reason.
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

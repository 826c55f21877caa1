"""Supervision: one task's failure ends that task (or restarts it), never its neighbours.

Design: an anyio task group cancels all its tasks when one raises; ``guarded`` runs a one-shot task
that logs a failure with a ref, ``service`` one restarted after ``RESTART_PAUSE`` (doubled after
each quick failure up to ``MAX_PAUSE``). Error policy: ``Exception`` (and groups of them) is logged;
cancellation and other ``BaseException``s pass, so stopping the server still stops everything.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

log = logging.getLogger(__name__)

RESTART_PAUSE = 0.5  # seconds before a failed service runs again (doubled after each quick failure)
MAX_PAUSE = 30.0
STEADY = 60.0  # a run at least this long resets the pause

AsyncFn = Callable[..., Awaitable[Any]]
_SERVICE = "__kernmind_service__"


def keeps_running(fn: AsyncFn) -> AsyncFn:
    """Mark ``fn`` as a service: a supervised group restarts it when it fails (see ``service``)."""
    setattr(fn, _SERVICE, True)
    return fn


def failed(what: str, exc: BaseException) -> str:
    """Log ``exc`` (with its traceback) as the failure of ``what`` under a fresh ref; the ref."""
    ref = secrets.token_hex(4)
    log.error(
        "task failed (ref %s) in %s: %s: %s",
        ref,
        what,
        type(exc).__name__,
        str(exc)[:300],
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return ref


def guarded(what: str, fn: AsyncFn) -> AsyncFn:
    """``fn`` with any ``Exception`` it raises logged under a ref instead of raised."""

    async def run(*args: Any) -> Any:
        try:
            return await fn(*args)
        except Exception as exc:
            failed(what, exc)
            return None

    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "guarded")
    return run


async def service(
    what: str,
    fn: AsyncFn,
    *args: Any,
    pause: float = RESTART_PAUSE,
    max_pause: float = MAX_PAUSE,
    steady: float = STEADY,
) -> None:
    """Run ``fn(*args)``, again after each failure (logged with a ref), until it returns."""
    wait = pause
    while True:
        started = time.monotonic()
        try:
            await fn(*args)
            return
        except Exception as exc:
            ref = failed(what, exc)
        if time.monotonic() - started >= steady:
            wait = pause
        log.warning("restarting %s in %.1fs (after ref %s)", what, wait, ref)
        await anyio.sleep(wait)
        wait = min(max_pause, wait * 2)


class Supervised:
    """A task group whose tasks cannot fail one another (see the module docstring)."""

    def __init__(self, group: TaskGroup, what: str) -> None:
        self._group = group
        self.what = what

    @property
    def cancel_scope(self) -> anyio.CancelScope:
        return self._group.cancel_scope

    def start_soon(self, fn: AsyncFn, *args: Any, name: object = None) -> None:
        """Start ``fn(*args)``; a failure is logged with a ref and ends only this task (restarts
        it, when ``fn`` is marked ``keeps_running``)."""
        if getattr(fn, _SERVICE, False):
            self.service(fn, *args, name=name)
            return
        label = f"{self.what}: {name or _name(fn)}"
        self._group.start_soon(guarded(label, fn), *args, name=name)

    def service(self, fn: AsyncFn, *args: Any, name: object = None, **timing: float) -> None:
        """Start ``fn(*args)``, restarted after each failure (``service``) until it returns."""
        label = f"{self.what}: {name or _name(fn)}"
        self._group.start_soon(lambda: service(label, fn, *args, **timing), name=name or label)

    async def start(self, fn: AsyncFn, *args: Any, name: object = None) -> Any:
        """Start ``fn(*args, task_status=…)`` and wait until it reports it started (its value);
        a failure before then is raised here, one after it is logged with a ref."""
        label = f"{self.what}: {name or _name(fn)}"

        async def run(*inner: Any, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
            status = _Status(task_status)
            try:
                await fn(*inner, task_status=status)
            except Exception as exc:
                if not status.reported:
                    raise
                failed(label, exc)

        return await self._group.start(run, *args, name=name)


class _Status:
    """A ``TaskStatus`` that remembers whether ``started`` was called."""

    def __init__(self, inner: TaskStatus[Any]) -> None:
        self.inner = inner
        self.reported = False

    def started(self, value: Any = None) -> None:
        self.reported = True
        self.inner.started(value)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)


@contextlib.asynccontextmanager
async def task_group(what: str) -> AsyncIterator[Supervised]:
    """A :class:`Supervised` group named ``what`` (for the log); waits for its tasks on exit,
    like an anyio task group."""
    async with anyio.create_task_group() as group:
        yield Supervised(group, what)

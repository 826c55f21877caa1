"""One request to a kernel, as every kind of kernel runs it: send, fold output, wait for idle.

Design: each kind of kernel gives a ``Channel`` (ZeroMQ or a gateway's WebSocket); the loop is
written once (``run_request``, ``await_interrupted``). A request is over at its idle status
(the shell reply is awaited ``REPLY_GRACE`` more at most), or, when no output came for
``IDLE_LOST_AFTER`` and its shell reply is there, at its reply: a flood of output can make a
subscriber's queue drop messages (ZeroMQ's high-water mark, at a gateway too), the idle status
among them, and the call must not then wait for its time limit. A silent probe then shows
whether the kernel's messages still arrive; when they do not, the outcome is ``died`` (the
interpreter is replaced, as for a kernel that stopped answering). ``Channel.check`` runs before
every wait, and a lost kernel is ``KernelLost``, an outcome with the output so far.

Error policy: nothing here raises on what a kernel sends; ``MALFORMED`` errors are counted and
skipped, ``KernelLost`` becomes the outcome, any other channel exception propagates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio.lowlevel

from kernmind.execution.kernels.messages import MALFORMED, Ignored, count_of, fold_output, message_parts
from kernmind.execution.results import OutputCollector

log = logging.getLogger(__name__)

REPLY_GRACE = 2.0  # seconds to wait for the execute_reply once the request went idle
IDLE_LOST_AFTER = 2.0  # seconds without output after which a request whose reply came is over
PROBE_GRACE = 5.0  # seconds a silent probe's idle status may take after an idle status was lost
STREAM_LOST = (
    "the kernel's messages stopped arriving (whatever relays them failed or overflowed): the code "
    "ran to its end, but its output is incomplete"
)

OutcomeKind = Literal["ok", "error", "died", "deadline", "closed"]


@dataclass
class ExecOutcome:
    kind: OutcomeKind
    execution_count: int | None = None
    exit_code: int | None = None
    detail: str | None = None  # why a kernel is gone, when "died" alone does not say it (remote kernels)
    ignored: int = 0  # malformed messages of the kernel that were skipped (see ``Ignored``)
    ignored_why: str | None = None  # what was wrong with the first one
    idle_lost: bool = False  # over at its reply: its idle status never came (see the Design)

    def ignored_note(self) -> str | None:
        """The note a result carries when kernel messages were skipped or lost."""
        lost = (
            "the kernel's end-of-call status never arrived (messages were dropped on the way, as a "
            "flood of output can make them be): the call ended at its reply, and output from its "
            "last moments may be missing."
            if self.idle_lost
            else None
        )
        if not self.ignored:
            return lost
        many = (
            f"{self.ignored} malformed Jupyter messages"
            if self.ignored > 1
            else "a malformed Jupyter message"
        )
        said = (
            f"the kernel sent {many} during this call ({self.ignored_why}); "
            "they were ignored and the rest of the output is shown."
        )
        return f"{said} Also, {lost}" if lost else said


class KernelLost(Exception):
    """A channel found its kernel gone: ``died`` (with an exit code or a sentence), or ``closed`` by us."""

    def __init__(
        self, kind: Literal["died", "closed"], *, exit_code: int | None = None, detail: str | None = None
    ) -> None:
        super().__init__(detail or kind)
        self.kind: Literal["died", "closed"] = kind
        self.exit_code = exit_code
        self.detail = detail

    def outcome(self, count: int | None) -> ExecOutcome:
        return ExecOutcome(self.kind, count, self.exit_code, self.detail)


class Channel(Protocol):
    """How one kind of kernel sends a request and receives what answers it: each method raises ``KernelLost``
    when the kernel is gone; ``output`` and ``reply`` may raise a ``MALFORMED`` error."""

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        """Send an ``execute_request``; its ``msg_id``."""
        ...

    async def check(self) -> float | None:
        """Raise ``KernelLost`` when the kernel is known to be gone; else the monotonic time by
        which it wants to be checked again (None: no need before the next message)."""
        ...

    async def output(self, timeout: float) -> Any:
        """The next iopub message, or None when none came within ``timeout`` seconds (or what
        came was for another channel)."""
        ...

    async def reply(self, timeout: float) -> Any:
        """The next shell message, or None when none came within ``timeout`` seconds."""
        ...


class Requests(Protocol):
    """What the loop keeps up to date on the kernel it drives."""

    running_msg_id: str | None  # the request an interrupt is aimed at
    execution_count: int  # of its last visible call


async def run_request(
    channel: Channel,
    kernel: Requests,
    code: str,
    collector: OutputCollector,
    *,
    deadline: float | None = None,
    silent: bool = False,
    store_history: bool = True,
) -> ExecOutcome:
    """The ``api.Kernel.execute`` contract: a ``deadline`` that passes first returns ``deadline`` with the
    output so far; cancelling leaves the request running (interrupt it afterwards)."""
    ignored = Ignored()
    try:
        msg_id = channel.send(code, silent=silent, store_history=store_history and not silent)
    except KernelLost as lost:
        return lost.outcome(None)
    kernel.running_msg_id = msg_id
    count: int | None = None
    had_error = False
    replied: dict[str, Any] | None = None  # the reply, when it ended the request (idle lost)
    quiet_until = time.monotonic() + IDLE_LOST_AFTER
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return _noted(ExecOutcome("deadline", count), ignored)
        try:
            check_by = await channel.check()
            until = min(t for t in (deadline, check_by, quiet_until, now + 3600) if t is not None)
            got = await _next(channel.output, max(0.0, until - time.monotonic()), ignored)
            if got is None and time.monotonic() >= quiet_until:
                replied = await _reply_now(channel, msg_id, ignored)
                if replied is not None:
                    log.warning("request %s ended at its reply: its idle status never came", msg_id)
                    break
                quiet_until = time.monotonic() + IDLE_LOST_AFTER
        except KernelLost as lost:
            return _noted(lost.outcome(count), ignored)
        if got is None:
            continue
        msg, (kind, parent_id, content) = got
        if parent_id != msg_id:
            continue
        quiet_until = time.monotonic() + IDLE_LOST_AFTER
        if kind == "status":
            if content.get("execution_state") == "idle":
                break
            continue
        count = fold_output(msg, collector, count)
        had_error = had_error or kind == "error"
    if replied is not None:
        count = count_of(replied.get("execution_count"), count)
        had_error = had_error or replied.get("status") == "error"
        if not await _still_answers(channel, deadline):
            if deadline is not None and time.monotonic() >= deadline:
                return _noted(ExecOutcome("deadline", count), ignored)
            return _noted(ExecOutcome("died", count, detail=STREAM_LOST), ignored)
    else:
        try:
            count = await _reply_count(channel, msg_id, ignored, count)
        except KernelLost as lost:
            if lost.kind == "died":
                return _noted(lost.outcome(count), ignored)
    if count is not None and not silent:
        kernel.execution_count = count
    return _noted(ExecOutcome("error" if had_error else "ok", count, idle_lost=replied is not None), ignored)


def _noted(outcome: ExecOutcome, ignored: Ignored) -> ExecOutcome:
    outcome.ignored, outcome.ignored_why = ignored.count, ignored.why
    return outcome


class ChannelKernel:
    """``execute`` for a kernel whose messages come through a ``Channel`` (one per request, from
    ``channel()``): local and gateway kernels derive from it, so they run requests alike."""

    running_msg_id: str | None
    execution_count: int

    def channel(self) -> Channel:
        raise NotImplementedError

    async def execute(
        self,
        code: str,
        collector: OutputCollector,
        *,
        deadline: float | None = None,
        silent: bool = False,
        store_history: bool = True,
    ) -> ExecOutcome:
        """``run_request`` on this kernel's channel (``api.Kernel.execute``)."""
        return await run_request(
            self.channel(),
            self,
            code,
            collector,
            deadline=deadline,
            silent=silent,
            store_history=store_history,
        )


async def _reply_count(channel: Channel, msg_id: str, ignored: Ignored, count: int | None) -> int | None:
    """The execution count of ``msg_id``'s shell reply (it arrives right around 'idle'), or
    ``count`` when it does not come within ``REPLY_GRACE``."""
    reply_by = time.monotonic() + REPLY_GRACE
    while (left := reply_by - time.monotonic()) > 0:
        got = await _next(channel.reply, left, ignored)
        if got is not None and got[1][1] == msg_id:
            return count_of(got[1][2].get("execution_count"), count)
    return count


async def _still_answers(channel: Channel, deadline: float | None) -> bool:
    """Whether a silent probe's idle status comes back (within ``PROBE_GRACE``, and the deadline)."""
    grace = PROBE_GRACE if deadline is None else min(PROBE_GRACE, deadline - time.monotonic())
    if grace <= 0:
        return False
    try:
        probe = channel.send("0", silent=True, store_history=False)
    except KernelLost:
        return False
    return await await_interrupted(channel, probe, OutputCollector(100), grace)


async def _reply_now(channel: Channel, msg_id: str, ignored: Ignored) -> dict[str, Any] | None:
    """The content of ``msg_id``'s shell reply if it is already there (others' are dropped)."""
    while (got := await _next(channel.reply, 0.0, ignored)) is not None:
        if got[1][1] == msg_id:
            return got[1][2]
    return None


async def await_interrupted(
    channel: Channel, msg_id: str | None, sink: OutputCollector, grace: float
) -> bool:
    """After an interrupt: True when ``msg_id`` went idle within ``grace`` seconds; its remaining streams go
    to ``sink``."""
    deadline = time.monotonic() + grace
    while (left := deadline - time.monotonic()) > 0:
        try:
            got = await _next(channel.output, left, Ignored())
        except KernelLost:
            return False
        except Exception as exc:  # a channel that fails now cannot say the kernel came back
            log.debug("reading an interrupted kernel's output failed: %s", exc)
            return False
        if got is None or got[1][1] != msg_id:
            continue
        msg, (kind, _, content) = got
        if kind == "stream":
            fold_output(msg, sink, None)
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
    return False


Parts = tuple[str, str | None, dict[str, Any]]


async def _next(
    receive: Callable[[float], Awaitable[Any]], timeout: float, ignored: Ignored
) -> tuple[Any, Parts] | None:
    """The next message ``receive`` gives within ``timeout`` and its parts (``message_parts``);
    None when none came, or what came was malformed (counted in ``ignored``)."""
    try:
        msg = await receive(timeout)
    except MALFORMED as exc:  # the message could not even be decoded
        why = f"{type(exc).__name__}: {exc}"
    else:
        if msg is None:
            return None
        parts = message_parts(msg)
        if not isinstance(parts, str):
            return msg, parts
        why = parts
    ignored.add(why)
    await anyio.lowlevel.checkpoint()  # a flood of malformed messages must not hold the event loop
    return None

"""One supervisor for every runner: the rules of a ``run_code`` call, written once.

``supervise(runner, call, progress=…)`` runs ``runner.execute(call)`` within the call's time
limit, workspace quota (``sandbox/quota.py``) and session memory (``sandbox/limits.py``; while
it runs, ``current_limits`` puts every sandbox it starts in the session's group), sends progress
about once a second, stops for ``close_session``, a server stop or a revoked principal, and
turns what the call produced into one ``RunResult`` (what callers see: docs/tools.md, "Limits
are per session"; the quota: docs/security.md, "The disk").

Design: a short call (the usual one) starts no task: the watcher (memory, quota sampler,
progress ticker) starts only once the call has run ``MEMORY_PERIOD``, and the scans read the
inotify trackers on the event loop when they have nothing to look at (docs/architecture.md,
"A run_code call", steps 4 and 6). Of the session this module writes ``session.running`` and
its working directory's ``last_scan``, nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

import anyio

from kernmind.config import Settings
from kernmind.execution.errors import SessionError
from kernmind.execution.kept_output import MAX_KEPT, OutputFile
from kernmind.execution.results import FileInfo, RunResult
from kernmind.execution.runners.base import Call, Runner
from kernmind.execution.runners.core import HELPER_PREFIX
from kernmind.execution.sandbox import quota as workspace_quota
from kernmind.execution.sandbox.confined import guess_mime
from kernmind.execution.sandbox.filescan import Scan, changed_since
from kernmind.execution.sandbox.limits import SessionLimits, current_limits
from kernmind.execution.sandbox.workspace import QuotaExceeded

log = logging.getLogger(__name__)

Progress = Callable[[str, float], Awaitable[None]]

QUOTA_PERIOD = 0.5  # seconds between workspace size checks while code runs (≥ 5× a check's own time)
MEMORY_PERIOD = 0.25  # seconds between looks at the session's out-of-memory count while code runs
# What a kernel started by the call puts in /run/kernmind (connection file, sockets), with room to spare.
KERNEL_OWN_NAMES = 32
KERNEL_OWN_BYTES = 1 << 20
OOM_COUNT_GRACE = 1.0  # seconds to look again for the killer's count after a process died killed
PREPARE_GRACE = 90.0  # seconds a runner may take to get an interpreter ready before the code starts
SCAN_BUDGET = 0.25  # seconds the post-call change scan may take
MAX_LISTED_FILES = 50


async def supervise(
    runner: Runner, call: Call, *, quota_bytes: int, progress: Progress | None = None
) -> RunResult:
    try:
        return await _supervise(runner, call, quota_bytes, progress)
    except BaseExceptionGroup as group:  # the task group wraps what execute() raised: unwrap it
        raise _only(group) from None


def _only(group: BaseExceptionGroup) -> BaseException:
    while len(group.exceptions) == 1 and isinstance(group.exceptions[0], BaseExceptionGroup):
        group = group.exceptions[0]
    return group.exceptions[0] if len(group.exceptions) == 1 else group


async def _supervise(runner: Runner, call: Call, quota_bytes: int, progress: Progress | None) -> RunResult:
    started_ns = time.time_ns()
    stop: str | None = None  # "timeout" | "quota" | "memory" | "closed"
    quota: QuotaExceeded | None = None
    interrupted: bool | None = None
    session = call.session
    limits: SessionLimits | None = session.limits
    start_usage: int | None = None
    if limits is not None:
        if limits.memory_exceeded():  # a process left running between calls went over
            await anyio.to_thread.run_sync(limits.stop)
            call.notes.append(f"between calls, {limits.memory_note(runner.language)}")
        start_usage = await workspace_quota.before_call(limits, session.workspace, quota_bytes)

    if not getattr(runner, "keeps_output", False) and not session.ephemeral:
        left = quota_bytes - (start_usage or 0) if quota_bytes > 0 else MAX_KEPT
        workspace = call.workspace
        call.collector.keeper = OutputFile(
            workspace.root,
            keep_after=call.collector.head_budget,
            limit=max(0, left),
            owner_uid=workspace.owner_uid,
        )

    async with anyio.create_task_group() as tg:
        run_scope = anyio.CancelScope()

        async def watch_quota() -> None:
            nonlocal stop, quota
            try:
                await _watch_quota(call, quota_bytes, start_usage, first=QUOTA_PERIOD - MEMORY_PERIOD)
            except QuotaExceeded as exc:
                if limits is not None:  # at once: what the interrupt does not stop cannot write on
                    await anyio.to_thread.run_sync(limits.block_writes)
                stop, quota = "quota", exc
                run_scope.cancel()

        async def watch() -> None:
            """Once the call has run a first period: the session's memory, and the quota and
            progress in tasks of their own."""
            nonlocal stop
            if quota_bytes > 0:
                tg.start_soon(watch_quota)
            if progress is not None:
                tg.start_soon(ticker.run)
            if limits is None:
                return
            while True:
                if limits.memory_exceeded():
                    await anyio.to_thread.run_sync(limits.stop)
                    stop = stop or "memory"
                    run_scope.cancel()
                    return
                await anyio.sleep(MEMORY_PERIOD)

        ticker = _ProgressTicker(call, progress)
        first_period = asyncio.get_running_loop().call_later(MEMORY_PERIOD, tg.start_soon, watch)
        session.running = run_scope
        token = current_limits.set(limits)
        try:
            with run_scope:
                # The limit counts from when the code starts; getting an interpreter ready
                # (a kernel from the pool) has its own bound.
                with anyio.move_on_after(call.timeout + PREPARE_GRACE) as deadline:

                    def start_clock() -> None:
                        deadline.deadline = anyio.current_time() + call.timeout
                        ticker.start()
                        if limits is not None:
                            limits.enforce()  # a kernel that just joined the session gets the write block

                    call.on_begin.append(start_clock)
                    if not getattr(runner, "prepares", False):
                        call.begin()
                    await runner.execute(call)
                if deadline.cancelled_caught:
                    stop = "timeout"
            if stop is None and limits is not None and await _killed_for_memory(limits, call):
                # The killer struck as the code ended (the kernel may have died of it).
                await anyio.to_thread.run_sync(limits.stop)
                stop = "memory"
            if run_scope.cancelled_caught and stop is None:
                stop = "closed"
        except BaseException:
            # The client went away or the server is stopping: stop the code, keep serving.
            with anyio.CancelScope(shield=True):
                if not session.closed:
                    await runner.interrupt(call)
                await runner.settle(call)
            raise
        finally:
            first_period.cancel()
            current_limits.reset(token)
            session.running = None
            tg.cancel_scope.cancel()

    with anyio.CancelScope(shield=True):
        if session.closed:
            stop = "closed"
        elif stop is not None:
            interrupted = await runner.interrupt(call)
        if not session.closed:
            await runner.settle(call)
        return await _result(runner, call, stop, quota, interrupted, started_ns, quota_bytes)


async def _killed_for_memory(limits: SessionLimits, call: Call) -> bool:
    """Whether the out-of-memory killer stopped a process of the session. Linux counts the kill
    just after sending the SIGKILL, so a busy machine can show the death first: when the call's
    interpreter or process died killed, look again for a moment before calling it a crash."""
    if limits.memory_exceeded():
        return True
    error = call.collector.error
    died = error is not None and (
        error.name == "KernelDied" or (error.name == "NonZeroExit" and "SIGKILL" in error.value)
    )
    if not died or limits.group is None:
        return False
    deadline = anyio.current_time() + OOM_COUNT_GRACE
    while anyio.current_time() < deadline:
        await anyio.sleep(0.02)  # a count in a cgroup file: nothing to wait on
        if limits.memory_exceeded():
            log.info("the out-of-memory count came after the death it caused")
            return True
    return False


class _ProgressTicker:
    """About once a second after the code started: the latest output line, or how long it has run."""

    def __init__(self, call: Call, progress: Progress | None) -> None:
        self.call = call
        self.progress = progress
        self.started = anyio.Event()
        self.start_time = 0.0

    def start(self) -> None:
        self.start_time = time.monotonic()
        self.started.set()

    async def run(self) -> None:
        if self.progress is None:
            return
        await self.started.wait()
        while True:
            await anyio.sleep(1.0)
            elapsed = time.monotonic() - self.start_time
            message = self.call.collector.last_line or f"running ({elapsed:.0f}s)"
            try:
                await self.progress(message, elapsed)
            except Exception as exc:  # a client that can't take progress must not break the run
                log.debug("progress notification failed: %s", exc)


async def _watch_quota(call: Call, limit: int, before: int | None, *, first: float = QUOTA_PERIOD) -> None:
    """Return never; raise ``QuotaExceeded`` once the call has grown the directory (with its
    runtime directory) past ``limit``. The first sample comes ``first`` seconds from now (a
    period after the start), so a short call costs no walk (the measurement after the call
    covers it); ``before`` is the size the call started from (measured before it; None: the
    first sample's, capped at the limit)."""
    if limit <= 0:
        await anyio.sleep_forever()
    while call.session.workspace is None:  # noqa: ASYNC110 (an interpreter is being made ready; its directory comes with it)
        await anyio.sleep(QUOTA_PERIOD)
    limits = call.session.limits
    baseline: tuple[int, int] | None = None
    if before is not None:
        names = limits.measured_names if limits is not None else None
        # Plus what an interpreter started for this call makes in /run/kernmind after the
        # measurement (connection file, sockets): not the code's. (It only matters for a session
        # over at the start, whose writes the kernel blocks anyway.)
        baseline = (before + KERNEL_OWN_BYTES, (names or 0) + KERNEL_OWN_NAMES)
    pause = first
    while True:
        await anyio.sleep(pause)
        pause = QUOTA_PERIOD
        workspace = call.session.workspace
        if workspace is None:
            continue
        t = time.perf_counter()
        # Bytes of every kind of inode, with the unnamed files its processes hold, and the names.
        usage = await workspace_quota.sample(limits, workspace)
        took = time.perf_counter() - t
        if baseline is None:
            baseline = (min(usage[0], limit), min(usage[1], workspace_quota.files_cap(limits)))
        # Stop code that grows the directory past the limit, not code that merely runs
        # while it is over (so a call that deletes files, or only reads them, still works).
        workspace_quota.check_growth(usage, limits, limit, baseline)
        await anyio.sleep(max(0.0, 4 * took))


async def _result(
    runner: Runner,
    call: Call,
    stop: str | None,
    quota: QuotaExceeded | None,
    interrupted: bool | None,
    started_ns: int,
    quota_bytes: int,
) -> RunResult:
    collector = call.collector
    notes = call.notes
    status = "error" if collector.error is not None else "ok"
    state_preserved = call.state_preserved
    if stop == "timeout":
        status, state_preserved = "timeout", bool(interrupted)
        limit = f"{call.timeout:g}s"
        if interrupted is True:
            notes.append(
                f"time limit of {limit} reached; the code was interrupted and the session kept its state."
            )
        elif interrupted is False:
            notes.append(
                f"time limit of {limit} reached and the code did not stop when interrupted; "
                "the interpreter was restarted (variables lost, files kept)."
            )
        else:
            notes.append(f"time limit of {limit} reached; the process and its children were killed.")
        # Keep the traceback of the interrupt: it shows where the code was when time ran out.
        where = collector.error.traceback if collector.error else ""
        collector.set_error("TimeoutError", f"execution exceeded the {limit} time limit", where)
    elif stop == "quota":
        assert quota is not None
        status, state_preserved = "error", interrupted  # (its error once the quota is measured, below)
        if interrupted is False:  # the quota's notes below then count without what went with it
            gone = "; what it wrote in /run/kernmind went with it" if runner.language == "python" else ""
            notes.append(
                "the code did not stop when interrupted; the interpreter was restarted (variables lost, "
                f"files in the working directory kept{gone})."
            )
    elif stop == "memory":
        assert call.session.limits is not None
        status, state_preserved = "error", False
        collector.set_error("MemoryLimitExceeded", call.session.limits.memory_note(runner.language), "")
    elif stop == "closed" and call.session.stopped_because:
        # The server stopped it and says why: an orderly stop (``Executor.stop_calls``), or a
        # revoked principal (``Executor.end_principal``: its sessions are ended, not kept running).
        status, state_preserved = "error", False if call.session.closed else interrupted
        collector.set_error(call.session.stopped_as, call.session.stopped_because, "")
    elif stop == "closed":
        status, state_preserved = "error", False
        collector.set_error(
            "SessionClosed",
            "the session was closed (close_session, idle reaping or shutdown) while this code ran.",
            "",
        )
    kept = collector.kept_note()  # before the scan: the files it names are among the call's
    if kept and call.session.ephemeral:
        kept = "the output was longer than this answer keeps; a --stateless server keeps no files."
    files, more = await _changed_files(call, started_ns)
    notes.extend(n for n in (more, collector.omitted_note(), kept) if n)
    if call.session.limits is not None and not call.session.closed:
        notes.extend(
            await workspace_quota.after_call(call.session.limits, call.session.workspace, quota_bytes)
        )
    if stop == "quota" and quota is not None:  # still over unless the measurement above let writes go
        limits = call.session.limits
        still_over = limits is None or call.session.closed or limits.writes_blocked
        collector.set_error("WorkspaceQuotaExceeded", quota.message(still_over=still_over), "")
    return RunResult(
        status=status,  # type: ignore[arg-type]
        language=runner.language,
        session_id=None if call.session.ephemeral else call.session.id,
        execution_count=call.execution_count,
        results=collector.results,
        logs=collector.logs(),
        error=collector.error,
        files=files,
        duration_ms=collector.elapsed_ms(),
        truncated=collector.truncated,
        state_preserved=state_preserved,
        notes=notes,
    )


async def _changed_files(call: Call, started_ns: int) -> tuple[list[FileInfo], str | None]:
    """What the call created or changed (at most MAX_LISTED_FILES), and a note when cut."""
    workspace = call.session.workspace
    if workspace is None or call.session.closed:
        return [], None
    before = workspace.last_scan
    after: Scan | None = workspace.scan_now()  # the tracker, when it has nothing to look at: no thread hop
    if after is None:
        try:
            after = await workspace.ascan(since_ns=started_ns, budget_s=SCAN_BUDGET)
        except Exception as exc:  # the call's own result matters more than its file list
            log.warning("change scan of %s failed: %s", workspace.root, exc)
            return [], "the working directory could not be scanned for changed files."
    # A partial scan is no baseline: the next call then goes by change times instead.
    workspace.last_scan = after if after.complete else None
    changed = [p for p in changed_since(after, before, started_ns) if not p.startswith(HELPER_PREFIX)]
    listed = [
        FileInfo(path=p, size=after.files[p].size, mime=guess_mime(p)) for p in changed[:MAX_LISTED_FILES]
    ]
    notes = []
    if len(changed) > MAX_LISTED_FILES:
        notes.append(f"{len(changed) - MAX_LISTED_FILES} more files were created or changed")
    if not after.complete:
        notes.append(
            f"the working directory is too large to scan fully in {SCAN_BUDGET:g}s, so this list may "
            "miss some changes"
        )
    if not notes:
        return listed, None
    return listed, "; ".join(notes) + ". list_files (with a prefix or pattern) shows them all."


def time_limit(
    settings: Settings, requested: float | None, *, background: bool = False
) -> tuple[float, list[str]]:
    """A call's time limit (``SessionError`` for a bad one), and a note when the request was lowered
    to the server's maximum."""
    top, flag = (
        (settings.max_job_seconds, "--max-job-seconds")
        if background
        else (settings.max_timeout, "--max-timeout")
    )
    if requested is None:
        return (top if background else min(settings.timeout, top)), []
    if not math.isfinite(requested) or requested <= 0:
        raise SessionError(f"timeout must be a positive number of seconds, got {requested!r}.")
    if requested > top:
        note = f"the requested timeout of {requested:g}s is above this server's maximum; the call ran with {top:g}s ({flag})."
        return top, [note]
    return requested, []

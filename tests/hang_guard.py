"""A test past its time limit fails with every thread's stack, and the run goes on.

Design: pytest-timeout's two methods both lose a hang in CI. Its signal method raises inside
the test, but the cleanup that follows can hang for good (Python 3.11's ``asyncio.run`` joins
its default executor without a limit, and the alarm fires once); its thread method ends the
process after writing the stacks to a terminal an xdist worker does not show. So this plugin
takes over pytest-timeout's timer (its ``pytest_timeout_set_timer`` hook): when a test runs
past ``timeout``, a thread sends a failed report whose text is every thread's stack, then ends
the process. Under xdist the controller prints that report, says the worker crashed (naming,
under ``--dist loadfile``, the test queued after the hung one, which then runs again), starts a
new one and finishes the run; without xdist the run ends there, after printing the report.
The process's descendants (servers, kernels, sandboxes the test started) are killed first: left
running, a busy one would slow every later test. tests/test_hang_guard.py checks all of it.

Error policy: nothing here may raise into pytest; a report that cannot be sent still ends
the process (a hung run is the one outcome worse than a lost report).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Any

import pytest

from tests.transport.procs import descendants

_TIMER = pytest.StashKey[threading.Timer]()


def _stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        parts.append(f"--- thread {names.get(ident, ident)} ---\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def _kill_descendants() -> None:
    for process in descendants(os.getpid()):
        try:
            os.kill(process.pid, signal.SIGKILL)
        except OSError:
            pass


def _tell_xdist_it_ended(item: pytest.Item, timeout: float) -> None:
    """Under xdist's scope schedulers (``--dist loadfile``, the README's), mark the test done, as
    the worker does after a test's protocol: else the controller puts the ended worker's whole
    group back, hung test included, and the next worker hangs on it again (up to xdist's limit of
    restarts). The test queued after it is then the one said to have crashed, and runs again on
    the next worker. ``--dist load`` drops the test it says crashed instead: there the hung one."""
    argv = " ".join(getattr(item.config, "workerinput", {}).get("mainargv", []))  # (a worker's own
    if not any(mode in argv for mode in ("loadgroup", "loadscope", "loadfile")):  # --dist is "no")
        return
    for plugin in item.config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "item_index"):
            plugin.sendevent("runtest_protocol_complete", item_index=plugin.item_index, duration=timeout)


def _expire(item: pytest.Item, timeout: float) -> None:
    try:
        text = f"Timeout: the test ran past {timeout:g} s. Every thread's stack then:\n\n{_stacks()}"
        report = pytest.TestReport(
            item.nodeid,
            item.location,
            {name: 1 for name in item.keywords},
            "failed",
            text,
            "call",
            duration=timeout,
        )
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # (what the test printed stays in the capture)
            capture.suspend_global_capture(in_=True)
        item.ihook.pytest_runtest_logreport(report=report)
        _tell_xdist_it_ended(item, timeout)
        terminal = item.config.pluginmanager.getplugin("terminalreporter")
        if terminal is not None and not hasattr(item.config, "workerinput"):
            # without xdist this is the end of the run: no summary will print the report
            terminal.write_line(f"\n{item.nodeid}\n{text}")
            terminal.write_line("the run ends here: a test past its time limit ends the process")
        sys.stdout.flush()
    finally:
        try:
            _kill_descendants()
        finally:
            os._exit(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if not settings.timeout or settings.timeout <= 0:
        return None
    timer = threading.Timer(settings.timeout, _expire, (item, settings.timeout))
    timer.name = "hang-guard"
    timer.daemon = True
    item.stash[_TIMER] = timer
    timer.start()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    timer = item.stash.get(_TIMER, None)
    if timer is None:
        return None
    timer.cancel()
    del item.stash[_TIMER]
    return True

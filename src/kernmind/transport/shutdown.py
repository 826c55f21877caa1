"""How a serving process stops: the signals, the second signal, exit codes.

Design: a second SIGTERM/SIGINT exits at once (130/143; bubblewrap's ``--die-with-parent`` takes the
sandboxes down). ``serve`` returns 0, ``EXIT_REFUSED`` (2) or ``EXIT_FAILED`` (1).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import anyio
import anyio.abc

log = logging.getLogger(__name__)

EXIT_REFUSED = 2
EXIT_FAILED = 1


class Shutdown:
    """Signal bookkeeping shared by both transports."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def force_exit(self, signum: int) -> None:
        log.warning("second %s while shutting down: exiting now", signal.Signals(signum).name)
        sys.stderr.flush()
        os._exit(128 + signum)


async def watch_signals(
    scope: anyio.CancelScope, state: Shutdown, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()  # handlers are installed before anything (a kernel) is started
        async for signum in signals:
            if state.signal is None:
                state.signal = signum
                log.info("%s: stopping kernels and closing the database", signal.Signals(signum).name)
                scope.cancel()
            else:
                state.force_exit(signum)

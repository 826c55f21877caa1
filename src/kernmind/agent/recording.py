"""Feeding the conversation recorder beside the loop.

Design: ``add`` queues and never waits; one task stores in order, compaction waits on
``caught_up``. Error policy: the task is shielded once started, so Ctrl-C loses no message;
the recorder logs what it cannot store.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, TaskGroup

from kernmind.agent.config import MessageRecorder

log = logging.getLogger(__name__)

CATCH_UP_SECONDS = 30.0


class Recording:
    def __init__(self, recorder: MessageRecorder) -> None:
        self.recorder = recorder
        self._send, self._receive = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
        self._servers_up = anyio.Event()
        self.queued = 0
        self.stored = 0
        self._progress = anyio.Event()  # set (and replaced) each time a message is stored

    def start(self, tasks: TaskGroup) -> None:
        tasks.start_soon(self._store_all)

    def servers_up(self) -> None:
        self._servers_up.set()

    def add(self, message: dict[str, Any]) -> None:
        self.queued += 1
        self._send.send_nowait(message)

    def close(self) -> None:
        """No more messages: the task stores what is queued, then closes the recorder."""
        self._send.close()

    async def caught_up(self) -> None:
        """Wait until every message added so far is stored (bounded: recording is best effort)."""
        with anyio.move_on_after(CATCH_UP_SECONDS) as scope:
            while self.stored < self.queued:
                await self._progress.wait()
        if scope.cancelled_caught:
            log.warning("the conversation recorder is %d messages behind", self.queued - self.stored)

    async def _store_all(self) -> None:
        queue: ObjectReceiveStream[dict[str, Any]] = self._receive
        await self._servers_up.wait()
        with anyio.CancelScope(shield=True):
            try:
                await self.recorder.start()
                async with queue:
                    async for message in queue:
                        await self.recorder.record(message)
                        self.stored += 1
                        self._progress.set()
                        self._progress = anyio.Event()
            finally:
                await self.recorder.close()

"""MCP on stdin/stdout: what desktop clients launch.

Design: our own reader and writer instead of the SDK's ``stdio_server``, whose reader thread a
signal cannot cancel and whose writer hops to a thread twice per answer; fd 1 then points at
stderr so stray output misses the wire. Error policy: nothing on stdin raises out of here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream

from kernmind.transport.shutdown import Shutdown, watch_signals
from kernmind.transport.stdio_framing import HEAD_BYTES, Line, Oversize, line_streams

log = logging.getLogger(__name__)

READ_SIZE = 1 << 16  # bytes read from stdin at a time
DEFAULT_MAX_LINE = 32 * 1024 * 1024  # one message; serve.py passes --max-request-mb


class StdinLines:
    """Cancellable async iterator over the lines of stdin, as bytes. A line longer than
    ``max_line`` is read past without being kept and stands as an ``Oversize`` (its head and
    size), so an endless line cannot fill the server's memory. fd 0 then points at /dev/null,
    so nothing else can steal protocol bytes."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_line = max_line
        self._fd = _dup_private(0)
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
        self._chunks: MemoryObjectReceiveStream[bytes] | None = None  # the thread's, once started
        try:
            mode = os.fstat(self._fd).st_mode
        except OSError:
            mode = 0
        self._direct = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)  # the loop can wait for it
        self._was_blocking = True
        if self._direct:
            try:
                self._was_blocking = os.get_blocking(self._fd)
                os.set_blocking(self._fd, False)  # a read after "readable" can then never wait
            except OSError:
                self._direct = False
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no newline
        self._eof = False
        self._skipping: Oversize | None = None  # a line past the limit, being read past

    def release(self) -> None:
        """Point fd 0 back at the original stdin, blocking as it was (the reader thread keeps its
        duplicate)."""
        with contextlib.suppress(OSError):
            if self._direct:
                os.set_blocking(self._fd, self._was_blocking)
            os.dup2(self._fd, 0)

    def _start_thread(self) -> MemoryObjectReceiveStream[bytes]:
        send, receive = anyio.create_memory_object_stream[bytes](16)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            try:
                while True:
                    try:
                        chunk = os.read(self._fd, READ_SIZE)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        break
                    anyio.from_thread.run(send.send, chunk, token=token)
            except Exception:  # the event loop is gone or the reader stopped listening
                return
            with contextlib.suppress(Exception):
                anyio.from_thread.run_sync(send.close, token=token)

        threading.Thread(target=pump, name="kernmind-stdin", daemon=True).start()
        return receive

    async def _read(self) -> bytes:
        """The next chunk of stdin (b"" at its end)."""
        if not self._direct:
            self._chunks = self._chunks or self._start_thread()
            try:
                return await self._chunks.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return b""
        while True:
            await anyio.wait_readable(self._fd)
            try:
                return os.read(self._fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return b""

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> Line:
        while True:
            newline = self._buffer.find(b"\n", self._searched)
            if newline >= 0 or (self._eof and (self._buffer or self._skipping)):
                end = newline + 1 if newline >= 0 else len(self._buffer)
                line = bytes(self._buffer[:end])
                del self._buffer[:end]
                self._searched = 0
                skipped, self._skipping = self._skipping, None
                if skipped is not None:
                    skipped.size += end
                    return skipped
                return line if len(line) <= self.max_line else Oversize(line[:HEAD_BYTES], len(line))
            if self._eof:
                raise StopAsyncIteration
            if self._skipping is None and len(self._buffer) > self.max_line:  # no end in sight
                self._skipping = Oversize(bytes(self._buffer[:HEAD_BYTES]), 0)
            if self._skipping is not None:  # stop keeping it
                self._skipping.size += len(self._buffer)
                self._buffer.clear()
            self._searched = len(self._buffer)
            chunk = await self._read()
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()


class StdoutLines:
    """The protocol's stdout: whole lines written from the event loop to a non-blocking private
    duplicate of fd 1 (see the module's docstring)."""

    def __init__(self) -> None:
        self._fd = _dup_private(1)
        self._was_blocking = os.get_blocking(self._fd)
        os.set_blocking(self._fd, False)
        with contextlib.suppress(OSError):
            os.dup2(2, 1)  # stray prints (ours, a library's, a child's) go to stderr

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:  # the pipe is full: the client reads slowly
                await anyio.wait_writable(self._fd)
                continue
            data = data[written:]

    async def flush(self) -> None:
        """Nothing is buffered here."""

    def release(self) -> None:
        """Point fd 1 back at the original stdout, blocking as it was."""
        with contextlib.suppress(OSError):
            os.set_blocking(self._fd, self._was_blocking)
            os.dup2(self._fd, 1)


def _dup_private(fd: int) -> int:
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except (ImportError, OSError):
        return os.dup(fd)


TTY_HINT = (
    "kernmind: speaking MCP on stdio, waiting for a client to write JSON-RPC here (this is what "
    "desktop clients launch); to try it: npx -y @modelcontextprotocol/inspector@2.12.0 --cli kernmind "
    "serve --method tools/list, or kernmind serve --transport http. Ctrl-C stops."
)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


async def serve_stdio(server: Any, max_line: int = DEFAULT_MAX_LINE) -> int:
    """Serve MCP on stdin/stdout until stdin closes, the client closes stdout, or SIGTERM/SIGINT
    arrives; ``max_line``: the longest message (a line) accepted."""
    from kernmind.sdk_compat import lowlevel_server

    lowlevel = lowlevel_server(server)  # MCPServer.run_stdio_async has no stdin hook
    state = Shutdown()
    on_terminal = _isatty(0)  # before StdinLines points fd 0 at /dev/null
    stdin = StdinLines(max_line)
    stdout = _stdout_lines()
    stdout_closed = False
    try:
        async with anyio.create_task_group() as outer:
            serving = anyio.CancelScope()
            await outer.start(watch_signals, serving, state)
            if on_terminal:  # a person typed `kernmind serve`: say what it waits for
                print(TTY_HINT, file=sys.stderr, flush=True)

            def closed() -> None:
                nonlocal stdout_closed
                stdout_closed = True
                serving.cancel()

            with serving:
                async with line_streams(stdin, stdout, max_line=max_line, on_closed=closed) as (
                    reading,
                    writing,
                ):
                    await lowlevel.run(reading, writing, lowlevel.create_initialization_options())
            if stdout_closed:
                log.info("stdout closed: kernels stopped, database closed")
            elif state.signal is None:
                log.info("stdin closed: kernels stopped, database closed")
            outer.cancel_scope.cancel()
    finally:
        stdout.release()
        stdin.release()
    return 0


class ThreadStdout:
    """Where fd 1 cannot be duplicated or made non-blocking: blocking writes on a worker thread."""

    async def write(self, text: str) -> None:
        await anyio.to_thread.run_sync(self._write, text.encode("utf-8"))

    @staticmethod
    def _write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def release(self) -> None:
        """Nothing was redirected."""


def _stdout_lines() -> StdoutLines | ThreadStdout:
    """Our stdout writer on the event loop, or one on a worker thread where fd 1 cannot be
    duplicated or made non-blocking."""
    try:
        return StdoutLines()
    except OSError as exc:
        log.info("writing stdout through a worker thread: %s", exc)
        return ThreadStdout()

"""MCP on stdin/stdout: what desktop clients launch.

Design
- The SDK's ``run_stdio_async`` reads stdin on a worker thread that cannot be cancelled, so a
  signal could never finish a shutdown while the client keeps stdin open. We hand
  ``stdio_server`` our own line reader instead, on a private duplicate of fd 0 (fd 0 itself
  then points at /dev/null, as the SDK does). When stdin is a pipe or a socket (what clients
  launch us with) the event loop itself waits for it to be readable and reads what is there:
  no thread, no hop per request; otherwise (a terminal, a file) a daemon thread reads it
  line by line. Either way the async side is cancellable. A signal cancels the serving scope; the lifespan's shielded cleanup runs
  (shutdown.py). Stdin closing is the normal way a client says goodbye.
- Answers are written to a private duplicate of fd 1, non-blocking, straight from the event
  loop (``StdoutLines``): the SDK's default hands every write and every flush to a worker
  thread, two thread hops per answer on every call's path. A client slow to read makes the
  write wait for the pipe to drain (``wait_writable``), never the event loop. fd 1 itself
  points at stderr meanwhile (as the SDK does), so stray output misses the wire.
- When stdin is a terminal (a person typed ``kernmind serve``), one line on stderr says that
  it speaks MCP on stdio and how to try it.
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
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernmind.transport.shutdown import Shutdown, watch_signals

log = logging.getLogger(__name__)

READ_SIZE = 1 << 16  # bytes read from stdin at a time


class StdinLines:
    """Cancellable async iterator over the lines of stdin.

    It reads a private duplicate of fd 0: on the event loop (non-blocking) when that is a pipe
    or a socket, else on a daemon thread that hands lines to the loop. fd 0 itself is pointed
    at /dev/null so that nothing else (a child, stray ``input()``) can steal protocol bytes.
    A blocked read never delays shutdown: the thread is a daemon and the async side simply
    stops listening.
    """

    def __init__(self) -> None:
        self._fd = _dup_private(0)
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
        self._file = os.fdopen(self._fd, "r", encoding="utf-8", errors="replace", closefd=False)
        self._receive: MemoryObjectReceiveStream[str] | None = None
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

    def release(self) -> None:
        """Point fd 0 back at the original stdin, blocking as it was (the reader thread keeps its
        duplicate)."""
        with contextlib.suppress(OSError):
            if self._direct:
                os.set_blocking(self._fd, self._was_blocking)
            os.dup2(self._fd, 0)

    def _start(self) -> MemoryObjectReceiveStream[str]:
        send: MemoryObjectSendStream[str]
        send, receive = anyio.create_memory_object_stream[str](16)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            try:
                while True:
                    try:
                        line = self._file.readline()
                    except (OSError, ValueError):
                        line = ""
                    if not line:
                        break
                    anyio.from_thread.run(send.send, line, token=token)
            except Exception:  # the event loop is gone or the reader stopped listening
                return
            with contextlib.suppress(Exception):
                anyio.from_thread.run_sync(send.close, token=token)

        threading.Thread(target=pump, name="kernmind-stdin", daemon=True).start()
        return receive

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        if self._direct:
            return await self._next_line()
        if self._receive is None:
            self._receive = self._start()
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def _next_line(self) -> str:
        """The next line, read on the event loop (stdin is a pipe or a socket)."""
        while True:
            newline = self._buffer.find(b"\n", self._searched)
            if newline >= 0:
                line = bytes(self._buffer[: newline + 1])
                del self._buffer[: newline + 1]
                self._searched = 0
                return line.decode("utf-8", "replace")
            self._searched = len(self._buffer)
            if self._eof:
                if not self._buffer:
                    raise StopAsyncIteration
                line, self._buffer, self._searched = bytes(self._buffer), bytearray(), 0
                return line.decode("utf-8", "replace")
            await anyio.wait_readable(self._fd)
            try:
                chunk = os.read(self._fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

    async def aclose(self) -> None:
        if self._receive is not None:
            await self._receive.aclose()


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


async def serve_stdio(server: Any) -> int:
    """Serve MCP on stdin/stdout until stdin closes or SIGTERM/SIGINT arrives."""
    from mcp.server.stdio import stdio_server

    from kernmind.sdk_compat import lowlevel_server

    lowlevel = lowlevel_server(server)  # MCPServer.run_stdio_async has no stdin hook
    state = Shutdown()
    on_terminal = _isatty(0)  # before StdinLines points fd 0 at /dev/null
    stdin = StdinLines()
    stdout = _stdout_lines()
    try:
        async with anyio.create_task_group() as outer:
            serving = anyio.CancelScope()
            await outer.start(watch_signals, serving, state)
            if on_terminal:  # a person typed `kernmind serve`: say what it waits for
                print(TTY_HINT, file=sys.stderr, flush=True)
            with serving:
                async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
            if state.signal is None:
                log.info("stdin closed: kernels stopped, database closed")
            outer.cancel_scope.cancel()
    finally:
        if stdout is not None:
            stdout.release()
        stdin.release()
    return 0


def _stdout_lines() -> StdoutLines | None:
    """Our stdout writer, or None (the SDK's own) where fd 1 cannot be duplicated or made non-blocking."""
    try:
        return StdoutLines()
    except OSError as exc:
        log.info("writing stdout through the SDK's worker thread: %s", exc)
        return None

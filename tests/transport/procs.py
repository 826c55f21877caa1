"""Helpers for the transport tests: real ``kernmind serve`` processes and a /proc scanner.

Every server runs as a separate process exactly as a user or an MCP client would start it
(``python -m kernmind serve …``), with its own data directory and TMPDIR and without any
``KERNMIND_*`` variable from the outer environment. HTTP servers listen on ``--port 0``
and print the URL they got; :func:`start_http` waits for that line.

Error policy: a server that fails to come up raises ``RuntimeError`` carrying its log, so
a failing test shows the server's own explanation.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL_LINE = re.compile(r"serving MCP on (http://\S+)")
START_TIMEOUT = 60.0


# Test servers preload nothing into their fork-server template (a test of preloading asks for it):
# numpy, pandas and matplotlib cost each server ≈ 2 s of CPU in the background, which the suite's
# other worker waits for (benchmarks/README.md, "The house, second pass", fifth sitting).
TEST_PRELOAD = {"KERNMIND_PRELOAD": "[]"}


def server_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a test server: no outer KERNMIND_* settings, a private TMPDIR.

    Kernels keep their runtime directories in ``$TMPDIR/km-*``; a private TMPDIR lets the
    shutdown tests check that nothing is left there.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNMIND_")}
    env.update(TEST_PRELOAD)
    tmpdir = tmp / "tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmpdir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def serve_argv(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kernmind",
        "serve",
        "--data-dir",
        str(data_dir),
        "--pool-size",
        "0",
        *extra,
    ]


# --- processes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    start: int  # start time in clock ticks since boot: (pid, start) names one process
    state: str
    cmdline: str

    def alive(self) -> bool:
        now = read_proc(self.pid)
        return now is not None and now.start == self.start and now.state not in ("Z", "X")


def read_proc(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    rest = stat[stat.rindex(")") + 2 :].split()
    return ProcInfo(
        pid=pid,
        ppid=int(rest[1]),
        start=int(rest[19]),
        state=rest[0],
        cmdline=raw.replace(b"\0", b" ").decode(errors="replace").strip(),
    )


def all_processes() -> list[ProcInfo]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = read_proc(int(name))
            if info is not None:
                out.append(info)
    return out


def descendants(pid: int) -> list[ProcInfo]:
    """Every live process below ``pid`` (kernels, bwrap, setpriv, prlimit …)."""
    procs = all_processes()
    children: dict[int, list[ProcInfo]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found: list[ProcInfo] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def mentioning(text: str) -> list[ProcInfo]:
    """Live processes whose command line contains ``text`` (e.g. a test's data directory)."""
    me = os.getpid()
    return [p for p in all_processes() if text in p.cmdline and p.pid != me and p.state not in ("Z", "X")]


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# --- HTTP servers ---------------------------------------------------------------------------
@dataclass
class HttpServer:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    data_dir: Path
    token: str | None
    started_in: float

    def headers(self, token: str | None = "") -> dict[str, str]:
        """Request headers; ``token=""`` (default) means the server's own token."""
        value = self.token if token == "" else token
        return {"Authorization": f"Bearer {value}"} if value else {}

    def client(self, mode: str = "legacy", token: str | None = "") -> Client:
        return http_client(self.url, self.headers(token), mode)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def http_client(url: str, headers: dict[str, str], mode: str = "legacy") -> Client:
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=120.0))
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def start_http(
    tmp: Path, *extra: str, token: str | None = None, env: dict[str, str] | None = None
) -> HttpServer:
    data_dir = tmp / "data"
    log = tmp / "server.log"
    argv = serve_argv(data_dir, "--transport", "http", "--port", "0", *extra)
    if token:
        argv += ["--token", token]
    t0 = time.monotonic()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**server_env(tmp), **(env or {})},
        )
    deadline = t0 + START_TIMEOUT
    while time.monotonic() < deadline:
        match = URL_LINE.search(log.read_text(errors="replace"))
        if match:
            return HttpServer(proc, match.group(1), log, data_dir, token, time.monotonic() - t0)
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    raise RuntimeError(f"kernmind serve --transport http did not start:\n{log.read_text(errors='replace')}")


@contextlib.contextmanager
def running_http(tmp: Path, *extra: str, token: str | None = None) -> Iterator[HttpServer]:
    server = start_http(tmp, *extra, token=token)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()


# --- stdio, spoken by hand (so the test owns the process and its stdin) ----------------------
@dataclass
class StdioServer:
    """A ``kernmind serve`` on pipes, driven with raw JSON-RPC lines (2025-11-25 handshake)."""

    proc: subprocess.Popen[bytes]
    log: Path
    data_dir: Path
    _buffer: bytes = b""
    _next_id: int = 1
    notes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(
        cls, tmp: Path, *extra: str, data_dir: Path | None = None, client_name: str = "kernmind-tests"
    ) -> StdioServer:
        """A server with its own log in ``tmp``, on ``data_dir`` (default ``tmp/data``), greeted
        by a client that calls itself ``client_name``."""
        data_dir = data_dir or tmp / "data"
        tmp.mkdir(parents=True, exist_ok=True)
        log = tmp / "server.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                serve_argv(data_dir, *extra),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=server_env(tmp),
            )
        server = cls(proc, log, data_dir)
        server.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": client_name, "version": "0"},
            },
        )
        server.notify("notifications/initialized")
        return server

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})})

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        rid = self._next_id
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == rid:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]
            self.notes.append(message)

    def wait_for_note(self, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
        """The first message from the server, not an answer to a request, that ``predicate`` takes."""
        deadline = time.monotonic() + timeout
        while not predicate(message := self._read_message(deadline)):
            self.notes.append(message)
        return message

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.request("tools/call", {"name": name, "arguments": arguments})
        assert not result.get("isError"), result
        return result

    def _read_message(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the server; log:\n{self.log.read_text(errors='replace')}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(f"server closed stdout; log:\n{self.log.read_text(errors='replace')}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_cli(
    args: Sequence[str], tmp: Path, timeout: float = 60.0, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m kernmind <args>`` to completion (for start-up refusals)."""
    return subprocess.run(
        [sys.executable, "-m", "kernmind", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=server_env(tmp, **env),
        stdin=subprocess.DEVNULL,
        check=False,
    )

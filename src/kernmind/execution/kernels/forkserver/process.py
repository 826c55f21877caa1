"""The fork server: one template process per kernel environment that forks fresh kernels
(docs/architecture.md, "Fresh interpreters come from a fork server").

Design: this module starts the template (``template.py``; clean environment, private directory,
one control socket), keeps its channels (and its snapshot's while it preloads) and restarts it.
``prelaunch()`` starts it before the event loop runs, ``running()`` adopts it; ``template()``
returns it from ``hello``, ``settled()`` once the preloads are in.

Error policy: ``template()`` is None while no usable template exists (``status()`` says why):
callers start kernels the normal way. A dead template restarts at most once per
``RESTART_BACKOFF``; a silent one is discarded; one with more than one thread at ``hello`` is
refused (a fork copies held locks), and one whose preloads leave a thread or too much memory is
replaced by one without them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from kernmind.execution.kernels.forkserver.channel import Channel, TemplateGone
from kernmind.execution.sandbox.rlimits import THREAD_STACK_MB
from kernmind.supervise import task_group as supervised_group

log = logging.getLogger(__name__)

TEMPLATE_SCRIPT = Path(__file__).with_name("template.py")
HELLO_TIMEOUT = 120.0  # importing pandas & co. on a busy 2-core machine can take a while
RESTART_BACKOFF = 5.0
DEFAULT_PRELOAD = ("numpy", "pandas", "matplotlib.pyplot")


def template_dirs(home: Path) -> dict[str, str]:
    """The template's home and the caches its imports may write (matplotlib's font list)."""
    return {
        "HOME": str(home),
        "IPYTHONDIR": str(home / "ipython"),
        "MPLCONFIGDIR": str(home / "mpl"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "JUPYTER_RUNTIME_DIR": str(home / "jupyter"),
    }


class TemplateProcess:
    """One running template: its process, its control channel and, while it preloads, its snapshot's (forked
    before the heavy imports, serving spawns meanwhile)."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, home: Path) -> None:
        self.proc = proc
        self.home = home
        self.control = Channel(sock, self.exit_status)
        self.snapshot: Channel | None = None
        self.hello: dict[str, Any] = {}  # what it said at hello, updated when its preloads are done
        self.preloading = True
        self._preloaded: anyio.Event | None = None  # made on the event loop, by read_hello
        self._gone: str | None = None

    @property
    def gone(self) -> str | None:
        """Why the template stopped (its process or its control channel), once it has."""
        return self._gone or self.control.gone

    @gone.setter
    def gone(self, why: str) -> None:
        self._gone = why

    @classmethod
    def launch(cls, python: str, env: Mapping[str, str], config: dict[str, Any]) -> TemplateProcess:
        """Start the template (call from the thread that runs, or will run, the event loop: the
        template dies with the thread that started it)."""
        home = Path(tempfile.mkdtemp(prefix="kmt-"))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Started under the sandbox's stack limit: glibc takes the default size of new
            # threads from it at start-up, and forks keep that default.
            stack = THREAD_STACK_MB * 1024 * 1024
            prefix = (
                [prlimit, f"--stack={stack}:{stack}", "--"] if (prlimit := shutil.which("prlimit")) else []
            )
            proc = subprocess.Popen(
                [*prefix, python, "-Xfrozen_modules=off", str(TEMPLATE_SCRIPT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env={**env, **template_dirs(home)},
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # stdout may be the MCP channel; stderr is our log
            )
        except BaseException:
            ours.close()
            shutil.rmtree(home, ignore_errors=True)
            raise
        finally:
            theirs.close()
        ours.send(json.dumps({**config, "server_pid": os.getpid()}).encode())
        return cls(proc, ours, home)

    async def read_hello(self, timeout: float) -> dict[str, Any]:
        self._preloaded = anyio.Event()
        with anyio.fail_after(timeout):
            self.hello, fds = await self.control.receive()
        if fds:  # the snapshot's socket, sent while the template still has preloads to import
            self.snapshot = Channel(socket.socket(fileno=fds[0]), self.exit_status)
            for fd in fds[1:]:
                os.close(fd)
        self.hello["forkable_seconds"] = self.hello.get("seconds")
        if not self.hello.get("pending"):
            self._done_preloading()
        return self.hello

    async def wait_preloaded(self) -> None:
        """Until the template has imported its heavy modules (or gone)."""
        if self._preloaded is not None:
            await self._preloaded.wait()

    async def serve_replies(self, on_preloaded: Callable[[TemplateProcess], None]) -> None:
        """Dispatch replies on both channels until the template goes away; ``on_preloaded``
        hears when the heavy modules are in (``hello`` then says which)."""

        def on_message(message: dict[str, Any]) -> None:
            if message.get("op") == "preloaded":
                self.hello.update(message)
                self._done_preloading()
                on_preloaded(self)

        try:
            async with anyio.create_task_group() as tg:
                if self.snapshot is not None:
                    tg.start_soon(self.snapshot.serve, on_message)
                await self.control.serve(on_message)
                tg.cancel_scope.cancel()
        finally:
            self._done_preloading()

    def _done_preloading(self) -> None:
        self.preloading = False
        if self.snapshot is not None:
            self.snapshot.retire()
        if self._preloaded is not None:
            self._preloaded.set()

    async def request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        """Send one request (to the snapshot while the template imports its preloads) and wait
        for its reply (the caller bounds the wait)."""
        if self.gone is not None:
            raise TemplateGone(self.gone)
        snapshot = self.snapshot
        if self.preloading and snapshot is not None and snapshot.gone is None and not snapshot.retiring:
            return await snapshot.request(message, fds)
        return await self.control.request(message, fds)

    def exit_status(self) -> str:
        code = self.proc.poll()
        return "still running" if code is None else f"exit status {code}"

    def stop(self) -> None:
        """Close the sockets (the template and its snapshot exit) and make sure the process is gone."""
        self.gone = self.gone or "stopped"
        for channel in (self.control, self.snapshot):
            if channel is not None:
                channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        shutil.rmtree(self.home, ignore_errors=True)


@dataclass
class ForkServer:
    """Keeps one template running for a kernel environment (``python`` and ``env``)."""

    python: str
    env: dict[str, str]
    setup: str
    kernel_args: list[str]
    preload: Sequence[str] = DEFAULT_PRELOAD
    memory_limit_mb: int | None = None  # each kernel's RLIMIT_DATA
    current: TemplateProcess | None = None
    last_error: str | None = None
    starts: int = 0
    dropped: str | None = None  # why the preloads were dropped, if they were
    _early: TemplateProcess | None = None  # launched by ``prelaunch``, adopted by ``running``
    _tg: TaskGroup | None = None
    _starting: anyio.Event | None = None
    _last_start: float = field(default=-RESTART_BACKOFF)

    def prelaunch(self) -> None:
        """Launch the template before the event loop runs, so its imports overlap the MCP SDK's; ``running()``
        adopts it. Call from the thread that will run the loop."""
        if self._early is None and self.current is None:
            self._early = TemplateProcess.launch(self.python, self.env, self._config())
            self._last_start = time.monotonic()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ForkServer]:
        """Start the template in the background; stop it (not the kernels it made) on exit."""
        async with supervised_group("fork server") as tg:  # a failed reader ends alone (supervise.py)
            self._tg = tg
            self._kick()
            try:
                yield self
            finally:
                self._tg = None
                for template in (self.current, self._early):
                    if template is not None:
                        template.stop()
                self._early = None
                tg.cancel_scope.cancel()

    def _config(self) -> dict[str, Any]:
        return {"preload": list(self.preload), "setup": self.setup, "kernel_args": self.kernel_args}

    def _kick(self, *, now: bool = False) -> None:
        """Start a template in the background unless one runs, is starting, or started lately
        (``now``: even then; a prelaunched one is adopted at once)."""
        alive = self.current is not None and self.current.gone is None
        recent = time.monotonic() - self._last_start < RESTART_BACKOFF and self._early is None and not now
        if self._tg is None or alive or self._starting is not None or recent:
            return
        self._last_start = time.monotonic()
        self._starting = anyio.Event()
        self._tg.start_soon(self._start_template)

    def _too_big(self, facts: dict[str, Any]) -> str | None:
        """Preloads that would use over half of each kernel's memory limit are dropped: every
        fork starts with the template's data counted against its RLIMIT_DATA."""
        data = float(facts.get("data_mib") or 0)
        if not self.preload or self.memory_limit_mb is None or data <= self.memory_limit_mb / 2:
            return None
        return (
            f"the fork-server template with {', '.join(self.preload)} uses {data:.0f} MiB of each "
            f"kernel's {self.memory_limit_mb} MiB memory limit (raise --memory-mb or shorten --preload)"
        )

    @staticmethod
    def _threads_problem(facts: dict[str, Any], preload: Sequence[str]) -> str | None:
        if facts.get("threads") == 1:
            return None
        return (
            f"the template runs {facts.get('threads')} threads after its preloads "
            f"({', '.join(preload) or 'none'}): forking it is unsafe (remove the module that starts them)"
        )

    async def _start_template(self) -> None:
        assert self._starting is not None
        try:
            await self._start_template_now()
        finally:
            self._starting.set()
            self._starting = None

    async def _start_template_now(self) -> None:
        if self.current is not None:
            if self.current.gone != "replaced":
                log.warning("fork-server template stopped (%s); starting a new one", self.current.gone)
            self.current.stop()
            self.current = None
        template, self._early = self._early, None
        try:
            template = template or TemplateProcess.launch(self.python, self.env, self._config())
            hello = await template.read_hello(HELLO_TIMEOUT)
            if not hello.get("ok"):
                raise RuntimeError(hello.get("error", "the template failed to start"))
            if problem := self._threads_problem(hello, ()):
                raise RuntimeError(problem)
        except Exception as exc:
            self.last_error = f"fork-server template unavailable: {exc}"
            log.warning("%s; kernels start the normal way", self.last_error)
            if template is not None:
                template.stop()
        except BaseException:  # cancelled while it starts (the server stopping): it must not outlive us
            if template is not None:
                template.stop()
            raise
        else:
            self.current = template
            self.last_error = None
            self.starts += 1
            log.info(
                "fork-server template ready in %.1f s%s",
                hello.get("seconds", 0),
                f" (preloading {', '.join(hello['pending'])})" if hello.get("pending") else "",
            )
            if not template.preloading:
                self._preloaded(template)
            assert self._tg is not None
            self._tg.start_soon(template.serve_replies, self._preloaded)

    def _preloaded(self, template: TemplateProcess) -> None:
        """The template's heavy modules are in: if they made it unsafe (a thread) or too big to
        fork, it is replaced by one without them, and ``status()`` says why."""
        facts = template.hello
        problem = self._threads_problem(facts, self.preload) or self._too_big(facts)
        if problem:
            log.warning("%s; starting the fork-server template without them", problem)
            self.dropped = problem
            template.control.abandon("replaced")
            self.preload = ()
            self._kick(now=True)
            return
        failed = facts.get("failed") or []
        log.info(
            "fork-server template preloaded %s in %.1f s%s",
            ", ".join(facts.get("preloaded", [])) or "nothing",
            facts.get("seconds", 0),
            f"; could not import {', '.join(failed)}" if failed else "",
        )

    def discard(self, template: TemplateProcess, why: str) -> None:
        """Give up on ``template`` (stopped or hung): fail what waits on it, start a new one."""
        if template.gone is None:
            log.warning("%s; replacing it", why)
            template.control.abandon(why)
            if template.snapshot is not None:
                template.snapshot.abandon(why)
        if template is self.current:
            self._kick(now=True)

    async def template(self, wait: float = 0.0) -> TemplateProcess | None:
        """The live template, starting one if needed; waits up to ``wait`` s for one starting."""
        self._kick()
        if self._starting is not None and wait > 0:
            with anyio.move_on_after(wait):
                await self._starting.wait()
        current = self.current
        if current is not None and current.gone is None:
            return current
        self._kick()
        return None

    async def settled(self, wait: float) -> TemplateProcess | None:
        """The live template once its heavy modules are in (or were dropped), waiting up to
        ``wait`` s; None when there is none (``status()`` says why)."""
        with anyio.move_on_after(wait):
            while (template := await self.template(wait=wait)) is not None:
                await template.wait_preloaded()
                if template.gone is None and not template.preloading:
                    return template
                await anyio.sleep(0.05)  # replaced (too big) or gone: look again
        return None

    def status(self) -> dict[str, Any]:
        current = self.current
        active = current is not None and current.gone is None
        info: dict[str, Any] = {"active": active, "starts": self.starts}
        if self.dropped:
            info["preloads_dropped"] = self.dropped
        if active and current is not None:
            info |= {
                "pid": current.proc.pid,
                "preloaded": current.hello.get("preloaded", []),
                "preloading": current.hello.get("pending", []) if current.preloading else [],
                "start_seconds": current.hello.get("seconds"),
            }
        elif self.last_error or (current is not None and current.gone):
            info["reason"] = self.last_error or f"template stopped: {current.gone if current else ''}"
        else:
            info["reason"] = "starting"
        return info

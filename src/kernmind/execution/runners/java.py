"""``java`` with JShell semantics, on warm sandboxed JVMs.

Design
- A cold ``jshell`` costs seconds, so snippets run in a host JVM (``JShellHost.java``, compiled
  once) over stdin/stdout frames, sandboxed like any process; it outlives calls, so it carries
  the creation guard (one started over the quota is retired once back under).
- Each call gets a fresh ``JShell``; the host restores streams, properties, locale and time
  zone; threads left running, ``MAX_CALLS`` or ``--stateless`` retire it. Hosts are kept per
  workspace, at most ``MAX_HOSTS``, stopped after ``IDLE_SECONDS``.

Error policy: compile errors are ``CompilationError`` (``SyntaxError`` when it does not parse);
exceptions keep their Java class, message and stack; a timeout kills the host; a host that
dies or breaks the protocol is ``JavaHostError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import platformdirs
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from kernmind.execution.results import OutputCollector
from kernmind.execution.runners.base import Call, RuntimeUnavailable, StatelessRunner
from kernmind.execution.runners.core import Context, exit_error, kill_tree
from kernmind.execution.sandbox.limits import current_limits
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from kernmind.execution.sessions.session import Session

INSTALL_HINT = "a JDK 11+ with jshell and javac (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless)"
HOST_SOURCE = Path(__file__).with_name("JShellHost.java")
MAGIC = b"\x00KMF"
START_TIMEOUT = 60.0
MAX_HOSTS = 4
MAX_CALLS = 200
IDLE_SECONDS = 600.0


def jvm_flags(memory_mb: int) -> list[str]:
    """Heap and native-area sizes that fit the JVM under RLIMIT_DATA = ``memory_mb``."""
    heap = max(32, memory_mb // 2)
    meta = max(64, min(256, memory_mb // 4))
    return [
        f"-Xmx{heap}m",
        "-Xms16m",
        f"-XX:MaxMetaspaceSize={meta}m",
        "-XX:CompressedClassSpaceSize=64m",
        "-XX:ReservedCodeCacheSize=48m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:-UsePerfData",
        "-Xss2m",
        "-Xshare:auto",
        "-Dfile.encoding=UTF-8",
        "-Dstdout.encoding=UTF-8",
    ]


@dataclass(eq=False)  # a host is itself (kept in a set until the call's result is ready)
class Host:
    process: Process
    reader: BufferedByteReceiveStream
    key: tuple[str, int | None]
    workspace: Workspace
    stderr_file: Path
    calls: int = 0
    last_used: float = field(default_factory=time.monotonic)
    broken: bool = False
    started_blocked: bool = False  # started over the quota: it creates nothing for life

    async def read_frame(self, collector: OutputCollector | None) -> tuple[str, bytes]:
        """The next frame; bytes outside frames are passed to ``collector`` as stdout."""
        while True:
            junk = await self.reader.receive_until(MAGIC, 1 << 20)
            if junk and collector is not None:
                collector.stream("stdout", junk.decode("utf-8", errors="replace"))
            header = await self.reader.receive_exactly(5)
            kind = chr(header[0])
            (length,) = struct.unpack(">I", header[1:])
            payload = await self.reader.receive_exactly(length) if length else b""
            return kind, payload

    async def send(self, code: str) -> None:
        data = code.encode("utf-8")
        assert self.process.stdin is not None
        await self.process.stdin.send(f"{len(data)}\n".encode() + data)

    def stderr_tail(self) -> str:
        try:
            return self.stderr_file.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    async def stop(self) -> None:
        self.broken = True
        kill_tree(self.process.pid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.process.wait()
        with contextlib.suppress(Exception):
            await self.process.aclose()
        with contextlib.suppress(OSError):
            self.stderr_file.unlink()


class JavaRunner(StatelessRunner):
    language = "java"

    def __init__(self, ctx: Context, java: str, javac: str, version: str) -> None:
        self.ctx = ctx
        self.java = java
        self.javac = javac
        self.version = version
        self.java_home = str(Path(os.path.realpath(java)).parents[1])
        self._hosts: dict[tuple[str, int | None], Host] = {}
        self._stopping: set[Host] = set()  # hosts to stop once the call's result is ready
        self._compile_lock = anyio.Lock()
        self._classes: Path | None = None

    @classmethod
    def probe(cls) -> dict[str, str] | str:
        """The constructor's ``java``, ``javac`` and ``version``, or what to install."""
        java, javac = shutil.which("java"), shutil.which("javac")
        if java is None or javac is None or shutil.which("jshell") is None:
            return INSTALL_HINT
        try:
            proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{INSTALL_HINT} ({java} does not run: {exc})"
        text = (proc.stderr or proc.stdout).strip().splitlines()
        first = text[0] if text else "java"
        # 'openjdk version "17.0.15" 2025-04-15' -> 'OpenJDK 17.0.15'
        parts = first.split('"')
        vendor = "OpenJDK" if first.startswith("openjdk") else first.split()[0]
        version = f"{vendor} {parts[1]} (JShell)" if len(parts) > 1 else first
        return {"java": java, "javac": javac, "version": version}

    # --- the compiled host ----------------------------------------------------------------
    async def _host_classes(self) -> Path:
        async with self._compile_lock:
            if self._classes is not None:
                return self._classes
            source = HOST_SOURCE.read_bytes()
            digest = hashlib.sha256(source + self.java_home.encode()).hexdigest()[:16]
            cache = Path(platformdirs.user_cache_dir("kernmind", appauthor=False)) / f"jshell-host-{digest}"
            if not (cache / "JShellHost.class").is_file():
                await anyio.to_thread.run_sync(self._compile, cache)
            self._classes = cache
            return cache

    def _compile(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".jshell-host-", dir=target.parent))
        try:
            proc = subprocess.run(
                [self.javac, "-nowarn", "-d", str(tmp), str(HOST_SOURCE)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode != 0:
                raise RuntimeUnavailable(f"cannot compile the JShell host: {proc.stderr.strip()[-1000:]}")
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            try:
                tmp.rename(target)
            except OSError:  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            if tmp.exists() and not target.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    # --- host lifecycle -----------------------------------------------------------------
    async def _start_host(self, workspace: Workspace) -> Host:
        classes = await self._host_classes()
        argv = [self.java, *jvm_flags(self.ctx.settings.memory_mb), "-cp", str(classes), "JShellHost"]
        cmd = self.ctx.wrap(argv, workspace, env={}, ro_paths=[str(classes), self.java_home], lasting=True)
        fd, err_name = tempfile.mkstemp(prefix="kernmind-jshell-", suffix=".log")
        try:
            process = await anyio.open_process(
                cmd.argv,
                env=cmd.env,
                cwd=cmd.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        assert process.stdout is not None
        host = Host(
            process,
            BufferedByteReceiveStream(process.stdout),
            (str(workspace.root), workspace.owner_uid),
            workspace,
            Path(err_name),
            started_blocked=_writes_blocked(),
        )
        try:
            with anyio.fail_after(START_TIMEOUT):
                kind, _ = await host.read_frame(None)
            if kind != "H":
                raise RuntimeError(f"unexpected frame {kind!r}")
        except BaseException as exc:
            tail = host.stderr_tail()
            with anyio.CancelScope(shield=True):
                await host.stop()
            if isinstance(exc, Exception):
                raise RuntimeUnavailable(f"the JShell host did not start: {tail.strip() or exc!r}") from exc
            raise
        return host

    async def _reap(self, keep: tuple[str, int | None] | None = None) -> None:
        now = time.monotonic()
        for key, host in list(self._hosts.items()):
            root = Path(key[0])
            gone = not _exists(root) or (key[1] is not None and _owner(root) != key[1])
            stale_owner = keep is not None and key[0] == keep[0] and key != keep
            if host.broken or gone or stale_owner or now - host.last_used > IDLE_SECONDS:
                del self._hosts[key]
                await host.stop()
        while len(self._hosts) >= MAX_HOSTS:
            key = min(self._hosts, key=lambda k: self._hosts[k].last_used)
            await self._hosts.pop(key).stop()

    async def release(self, session: Session) -> None:
        workspace = session.workspace
        if workspace is not None:
            for key in [k for k in self._hosts if k[0] == str(workspace.root)]:
                await self._hosts.pop(key).stop()

    async def aclose(self) -> None:
        hosts, self._hosts = list(self._hosts.values()), {}
        for host in hosts:
            await host.stop()

    # --- running a snippet --------------------------------------------------------------------
    async def execute(self, call: Call) -> None:
        collector, workspace = call.collector, call.workspace
        key = (str(workspace.root), workspace.owner_uid)
        host = self._hosts.pop(key, None)
        if host is not None and (
            host.broken
            or host.process.returncode is not None
            or (host.started_blocked and not _writes_blocked())
        ):
            await host.stop()
            host = None
        await self._reap(keep=key)
        reply: dict[str, object] | None = None
        failure: Exception | None = None
        try:
            if host is None:
                host = await self._start_host(workspace)
            await host.send(call.code)
            while True:
                kind, payload = await host.read_frame(collector)
                if kind == "O":
                    collector.stream("stdout", payload.decode("utf-8", errors="replace"))
                elif kind == "E":
                    collector.stream("stderr", payload.decode("utf-8", errors="replace"))
                elif kind == "R":
                    reply = json.loads(payload.decode("utf-8", errors="replace"))
                    break
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, ValueError) as exc:
            failure = exc
        except BaseException:
            # Cancelled (time limit, quota, close, client): the JVM goes, the next call starts afresh.
            if host is not None:
                with anyio.CancelScope(shield=True):
                    await host.stop()
            raise
        if failure is not None and host is not None:
            await self._report_failure(host, failure, call)
        if host is not None:
            self._keep_or_stop(host, key, reply, call)
        if reply is not None:
            if reply.get("status") == "ok" and reply.get("value") is not None:
                collector.display({"text/plain": str(reply["value"])}, main=True)
            if reply.get("status") == "error":
                name = str(reply.get("name") or "Error")
                value = str(reply.get("value") or "")
                tb = str(reply.get("traceback") or f"{name}: {value}")
                collector.set_error(name, value, tb)

    async def _report_failure(self, host: Host, failure: Exception, call: Call) -> None:
        exit_code = None
        with anyio.move_on_after(2):
            exit_code = await host.process.wait()
        if exit_code is not None and exit_code != 0:
            exit_error(call.collector, exit_code, host.stderr_tail())
        elif exit_code is None:
            call.collector.set_error(
                "JavaHostError",
                "the Java process stopped answering (out of memory or a crash)",
                host.stderr_tail() or repr(failure),
            )
        else:
            call.notes.append("the code called System.exit(0); its JVM ended.")

    def _keep_or_stop(
        self, host: Host, key: tuple[str, int | None], reply: dict[str, object] | None, call: Call
    ) -> None:
        host.calls += 1
        host.last_used = time.monotonic()
        dirty = bool(reply and reply.get("dirty"))
        if dirty:
            call.notes.append("the code left threads running; they were stopped with its JVM.")
        if reply is None or dirty or call.session.ephemeral or host.calls >= MAX_CALLS:
            self._stopping.add(host)
        else:
            self._hosts[key] = host

    async def settle(self, call: Call) -> None:
        stopping, self._stopping = self._stopping, set()
        for host in stopping:
            await host.stop()


def _writes_blocked() -> bool:
    """Whether the session of this call is over its quota now (``sandbox/limits.py``)."""
    limits = current_limits.get()
    return limits is not None and limits.writes_blocked


def _exists(path: Path) -> bool:
    return _owner(path) is not None


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None

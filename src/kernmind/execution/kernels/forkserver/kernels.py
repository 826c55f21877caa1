"""Fresh kernels made by forking the template into a normal kernel sandbox (docs/architecture.md,
"Fresh interpreters come from a fork server").

Design: ``ForkKernelFactory.start`` returns the same ``Kernel`` as ``KernelFactory.start``, from
the same ``LaunchPlan``; only the sandbox's command differs (a placeholder the template forks
the kernel into, passing its exit status on). A spawn's reply is awaited at most
``SPAWN_TIMEOUT`` and the call's time limit; a silent template is discarded and replaced.

Error policy: when the template is unavailable or a fork fails, ``start`` logs why and starts
the kernel the normal way (a broken fork server costs speed, never availability).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.forkserver.process import DEFAULT_PRELOAD, ForkServer, TemplateProcess
from kernmind.execution.kernels.local import (
    KERNEL_ARGS,
    START_TIMEOUT,
    KernelFactory,
    LaunchPlan,
    import_kernel_manager,
    start_wait,
)
from kernmind.execution.kernels.local_kernel import Kernel
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import creation_guard, lifeline
from kernmind.execution.sandbox.cgroups import Cgroup
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:  # zmq and jupyter_client load when the factory starts, after the handshake
    import zmq.asyncio

log = logging.getLogger(__name__)

PLACEHOLDER = ["/bin/sh", "-c", 'echo ready; read -r code; exit "${code:-1}"']
NAMESPACES = ("user", "cgroup", "ipc", "uts", "net", "pid", "mnt")
TEMPLATE_WAIT = 60.0  # a kernel asked for while the template starts waits for it this long
SPAWN_TIMEOUT = 45.0  # a template silent this long after a spawn request is hung: it is replaced


class ForkFailed(RuntimeError):
    """One fork did not produce a ready kernel (the reason is the message)."""


class ForkKernelFactory:
    """A ``KernelFactory`` whose kernels are forks of a warm template (``base`` is the fallback)."""

    rebinds_warm_kernels = True  # its kernels are local sandboxes, like ``KernelFactory``'s
    joins_groups = True  # its kernels can start in a session's control group (``start(…, group)``)

    @property
    def cheap_starts(self) -> bool:
        """True while the template is up: a fork costs the server little and runs in other
        processes (the pool then refills at once and in parallel)."""
        template = self.server.current
        return template is not None and template.gone is None

    def __init__(self, base: KernelFactory, *, preload: Sequence[str] = DEFAULT_PRELOAD) -> None:
        self.base = base
        self.server = ForkServer(
            python=base.runtime.executable,
            env=base.sandbox.environment("/", template_environment(base)),
            setup=base.setup,
            kernel_args=list(KERNEL_ARGS),
            preload=preload,
            memory_limit_mb=(base.limits or base.sandbox.limits).memory_mb,
        )
        self._welcome = _ipykernel_major(base.runtime.ipykernel) >= 7
        # One zmq context (one I/O thread) for every forked kernel's manager and client,
        # instead of two per kernel; made with the first fork (zmq loads after the
        # handshake), destroyed when ``running()`` ends.
        self._zmq: zmq.asyncio.Context | None = None
        self._users = 0  # how many ``running()`` blocks are open
        self._said: str | None = None  # the last fallback reason logged

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ForkKernelFactory]:
        """Keep the template running (it is started in the background) while in this block."""
        if self.base.runtime.error or self._users:  # nested (a second client's lifespan): already running
            self._users += 1
            try:
                yield self
            finally:
                self._users -= 1
            return
        self._users = 1
        try:
            async with self.server.running():
                yield self
        finally:
            self._users = 0
            if self._zmq is not None:
                self._zmq.destroy(linger=0)
                self._zmq = None

    def prelaunch(self) -> None:
        """Launch the template now (see ``ForkServer.prelaunch``); ``running()`` adopts it."""
        if not self.base.runtime.error:
            self.server.prelaunch()

    def _context(self) -> zmq.asyncio.Context:
        if self._zmq is None:
            import zmq.asyncio

            self._zmq = zmq.asyncio.Context()
        return self._zmq

    def status(self) -> dict[str, Any]:
        return self.server.status()

    async def start(self, workspace: Workspace | None = None, group: Cgroup | None = None) -> Kernel:
        """A fresh, set-up kernel (inside ``group``, a session's, or a group of its own): forked
        when the template is up, else started normally."""
        if self.base.runtime.error:
            raise RuntimeUnavailable(self.base.runtime.error)
        template = await self.server.template(wait=start_wait(TEMPLATE_WAIT))
        if template is None:
            self._fallback(self.server.status().get("reason", "no template"))
            return await self.base.start(workspace, group)
        try:
            kernel = await self.fork(template, workspace, group)
        except ForkFailed as exc:
            self._fallback(str(exc))
            return await self.base.start(workspace, group)
        self._said = None
        return kernel

    def _fallback(self, reason: str) -> None:
        if reason != self._said:  # say it once, not for every kernel
            log.warning("fork server not used (%s): starting kernels the normal way", reason)
            self._said = reason

    async def fork(
        self, template: TemplateProcess, workspace: Workspace | None = None, group: Cgroup | None = None
    ) -> Kernel:
        """Launch a placeholder sandbox, have the template fork a kernel into it, connect."""
        await import_kernel_manager()
        plan = LaunchPlan.make(self.base, workspace, group)
        kernel_argv: list[str] = []

        def wrap(cmd: list[str]) -> list[str]:
            kernel_argv[:] = cmd[cmd.index("ipykernel_launcher") + 1 :]
            return plan.wrap(PLACEHOLDER, as_kernel=False)

        km = plan.manager(wrap, context=self._context())
        kernel = plan.kernel(km)
        exit_read, exit_write = os.pipe()
        try:
            with anyio.fail_after(START_TIMEOUT):
                await km.start_kernel(
                    **plan.start_arguments(),
                    stdin=exit_read,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                os.close(exit_read)
                exit_read = -1
                process = km.provisioner.process  # type: ignore[union-attr]
                await _read_ready(process.stdout)
                placeholder = _placeholder_pid(process.pid)
                wait = start_wait(SPAWN_TIMEOUT)
                with anyio.move_on_after(wait) as waiting:
                    reply = await _spawn(template, plan, placeholder, exit_write, kernel_argv)
                if waiting.cancelled_caught:
                    self._unanswered(template, wait)
                if not reply.get("ok"):
                    raise ForkFailed(f"fork failed: {reply.get('error')}")
                kernel.forked_pid = reply.get("pid")
                # The manager's own Session, not a clone: a clone restarts the message counter,
                # so an interrupt_request could reuse the running execute_request's msg_id.
                kc = km.client(context=self._context(), session=km.session)
                kc.start_channels(hb=False)  # liveness comes from the process, not heartbeats
                kernel.kc = kc
                if self._welcome:
                    await _wait_for_welcome(kc)
                else:
                    await kc.wait_for_ready(timeout=START_TIMEOUT)
        except BaseException as exc:
            await plan.abandon(kernel)
            if isinstance(exc, Exception) and not isinstance(exc, ForkFailed):
                raise ForkFailed(f"fork failed: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            for fd in (exit_read, exit_write):
                if fd >= 0:
                    os.close(fd)
        return kernel

    def _unanswered(self, template: TemplateProcess, waited: float) -> None:
        """A spawn went unanswered for ``waited`` s: replace the template when it is stopped
        or has been silent for the whole ``SPAWN_TIMEOUT`` (merely slow: keep it); raise ``ForkFailed``."""
        stopped = _is_stopped(template.proc.pid)
        why = f"the fork-server template did not answer within {waited:.0f}s" + (
            " (its process is stopped)" if stopped else ""
        )
        if stopped or waited >= SPAWN_TIMEOUT:
            self.server.discard(template, why)
        raise ForkFailed(why)


def _is_stopped(pid: int) -> bool:
    """True when ``pid`` is stopped (SIGSTOP) or stopped by a tracer."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] in ("T", "t")


TEMPLATE_UNSET = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
)


def template_environment(base: KernelFactory) -> dict[str, str]:
    """A kernel's variables without its directories and without those that start BLAS threads (the template
    must hold no thread when it forks)."""
    env = base.environment(None)
    for name in TEMPLATE_UNSET:
        env.pop(name, None)
    return env


async def _spawn(
    template: TemplateProcess, plan: LaunchPlan, placeholder: int, exit_write: int, argv: list[str]
) -> dict[str, Any]:
    """Ask the template for ``plan``'s kernel inside ``placeholder``'s sandbox (and control group)."""
    names, fds = _namespace_fds(placeholder)
    try:
        request = {
            "op": "spawn",
            "argv": argv,
            "cwd": plan.cwd,
            "uid": plan.uid,
            "placeholder_pid": placeholder,
            "namespaces": names,
            "cgroup": [str(p) for p in plan.group.join] if plan.group is not None else [],
            "seccomp": plan.factory.sandbox.seccomp,
            "guard": plan.factory.sandbox.guard,  # the waiter answers it (creation_guard.py)
            "guard_module": creation_guard.__file__,
            "lifeline_module": lifeline.__file__,  # kills what a kernel left where no pid namespace does
        }
        return await template.request(request, [exit_write, *fds])
    finally:
        for fd in fds:
            os.close(fd)


def _namespace_fds(pid: int) -> tuple[list[str], list[int]]:
    """A pidfd for ``pid`` (so the template can check it is still the same process), then
    descriptors for its namespaces, with their names."""
    fds: list[int] = []
    try:
        fds.append(os.pidfd_open(pid))
        names = [n for n in NAMESPACES if os.path.exists(f"/proc/{pid}/ns/{n}")]
        fds.extend(os.open(f"/proc/{pid}/ns/{n}", os.O_RDONLY) for n in names)
    except OSError as exc:  # the placeholder vanished under us
        for fd in fds:
            os.close(fd)
        raise ForkFailed(f"the sandbox ended before the fork: {exc}") from exc
    return names, fds


async def _read_ready(stream: Any) -> None:
    """The placeholder's ``ready`` line: its sandbox is fully set up."""
    fd = stream.fileno()
    data = b""
    while not data.endswith(b"\n"):
        await anyio.wait_readable(fd)
        chunk = os.read(fd, 64)
        if not chunk:
            raise ForkFailed(f"the sandbox did not start (placeholder said {data!r})")
        data += chunk
    stream.close()


def _placeholder_pid(pid: int) -> int:
    """Follow first children down from ``pid`` (prlimit→bwrap→init→placeholder) to the placeholder."""
    while True:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if not children:
            break
        pid = int(children[0])
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
    except OSError:
        cmdline = []
    if [part.decode(errors="replace") for part in cmdline] != PLACEHOLDER:
        raise ForkFailed(f"could not find the sandbox's placeholder process (found pid {pid}: {cmdline!r})")
    return pid


async def _wait_for_welcome(kc: Any) -> None:
    """iopub is subscribed once the kernel's welcome arrives; shell and control are bound."""
    with anyio.fail_after(START_TIMEOUT):
        while True:
            msg = await kc.get_iopub_msg()
            if msg["msg_type"] == "iopub_welcome":
                return


def _ipykernel_major(version: str | None) -> int:
    try:
        return int((version or "0").split(".")[0])
    except ValueError:
        return 0


async def fork_server_report(base: KernelFactory, preload: Sequence[str] = DEFAULT_PRELOAD) -> dict[str, Any]:
    """What ``kernmind doctor`` shows: whether the fork server works here and how fast it forks (three
    kernels, median start to ready, ``1 + 1`` in the last)."""
    factory = ForkKernelFactory(base, preload=preload)
    started = time.perf_counter()
    async with factory.running():
        template = await factory.server.settled(wait=TEMPLATE_WAIT)
        if template is None:
            return {"active": False, "reason": factory.status().get("reason")}
        report: dict[str, Any] = {
            "active": True,
            "template_start_s": round(time.perf_counter() - started, 2),
            "template_forks_s": template.hello.get("forkable_seconds"),
            "preloaded": template.hello.get("preloaded", []),
        }
        if dropped := factory.status().get("preloads_dropped"):
            report["preloads_dropped"] = dropped
        times, kernels = [], []
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                kernels.append(await factory.fork(template))
                times.append((time.perf_counter() - t0) * 1000)
            collector = OutputCollector(1000)
            outcome = await kernels[-1].execute("1 + 1", collector, deadline=time.monotonic() + 30)
            value = collector.results[0].text if collector.results else None
        except ForkFailed as exc:
            return {"active": False, "reason": str(exc)}
        finally:
            for kernel in kernels:
                await kernel.shutdown()
                kernel.workspace.remove()
        report["fork_ms"] = round(sorted(times)[1], 1)
        report["ok"] = outcome.kind == "ok" and value == "2"
        return report


def describe(report: dict[str, Any]) -> str:
    """One line for ``kernmind doctor``'s text output."""
    if not report.get("active"):
        return f"not used — {report.get('reason')} (kernels start the normal way)"
    if not report.get("ok"):
        return "FAILED — a forked kernel did not answer 1 + 1 (kernels start the normal way)"
    preloaded = ", ".join(report["preloaded"]) or "no heavy modules"
    if report.get("preloads_dropped"):
        preloaded += f"; preloads dropped: {report['preloads_dropped']}"
    return (
        f"active — a fresh kernel in {report['fork_ms']:.0f} ms "
        f"(template forks after {report.get('template_forks_s')} s, ready in {report['template_start_s']} s with {preloaded})"
    )

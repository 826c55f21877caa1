"""The message loop every kernel shares (``kernels/exchange.py``), driven by scripted channels.

Messages in, an ``ExecOutcome`` and a collector's output out, in milliseconds: which messages
belong to the request, when it is over, which execution count it had and whether the
kernel's changes (a silent run's does not), what a kernel lost mid-call returns, and what
an interrupt waits for. The last tests drive the two real channels — a local kernel's over
its ZeroMQ client, a gateway kernel's over its WebSocket — with scripted sockets, so their
translations (a process that died, a shutdown under the call, a gateway's restart notice, a
closed connection, a reply that comes before idle) are checked here too. The real kernels'
end-to-end tests are beside this file (``test_kernel_python.py``, ``test_gateway.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from kernmind.execution.kernels import exchange
from kernmind.execution.kernels.exchange import KernelLost, await_interrupted, run_request
from kernmind.execution.kernels.gateway.client import ChannelsClosed
from kernmind.execution.kernels.gateway.kernels import GatewayKernel
from kernmind.execution.kernels.local_kernel import READS_PER_YIELD, Kernel
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.workspace import Workspace

pytestmark = [pytest.mark.anyio, pytest.mark.fast]  # scripted channels and clients: no real kernel

REQ = "req-1"


def msg(
    kind: str, content: dict[str, Any] | None = None, parent: str | None = REQ, channel: str = "iopub"
) -> dict:
    return {
        "msg_type": kind,
        "parent_header": {"msg_id": parent} if parent else {},
        "content": content or {},
        "channel": channel,
    }


def stream(text: str, name: str = "stdout", parent: str = REQ) -> dict:
    return msg("stream", {"name": name, "text": text}, parent)


def idle(parent: str | None = REQ) -> dict:
    return msg("status", {"execution_state": "idle"}, parent)


def busy(parent: str | None = REQ) -> dict:
    return msg("status", {"execution_state": "busy"}, parent)


def reply(count: int | None, parent: str = REQ) -> dict:
    return msg("execute_reply", {"status": "ok", "execution_count": count}, parent, "shell")


class ScriptedChannel:
    """An ``exchange.Channel`` that plays back a script: each entry is a message, an exception
    to raise, or None (nothing came); a script that is done waits out the timeout."""

    def __init__(self, output: list[Any], replies: list[Any] = ()) -> None:  # type: ignore[assignment]
        self.outputs = list(output)
        self.replies = list(replies)
        self.sent: list[tuple[str, bool, bool]] = []
        self.checks = 0

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        self.sent.append((code, silent, store_history))
        return REQ

    async def check(self) -> float | None:
        self.checks += 1
        return None

    async def output(self, timeout: float) -> Any:
        return await self._next(self.outputs, timeout)

    async def reply(self, timeout: float) -> Any:
        return await self._next(self.replies, timeout)

    @staticmethod
    async def _next(script: list[Any], timeout: float) -> Any:
        if not script:
            await anyio.sleep(timeout)
            return None
        entry = script.pop(0)
        if isinstance(entry, BaseException):
            raise entry
        return entry


class State:
    def __init__(self, count: int = 0) -> None:
        self.running_msg_id: str | None = None
        self.execution_count = count


async def test_output_is_folded_until_idle_and_the_reply_gives_the_count() -> None:
    channel = ScriptedChannel(
        [
            busy(),
            msg("execute_input", {"execution_count": 4}),
            stream("hello\n"),
            stream("careful\n", "stderr"),
            msg("display_data", {"data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}}),
            msg("execute_result", {"data": {"text/plain": "42"}, "execution_count": 4}),
            idle(),
            stream("after idle: not this call's\n"),
        ],
        [reply(4)],
    )
    kernel, collector = State(3), OutputCollector(10_000)
    outcome = await run_request(channel, kernel, "print('hello')", collector)
    assert (outcome.kind, outcome.execution_count, outcome.ignored) == ("ok", 4, 0)
    assert channel.sent == [("print('hello')", False, True)]
    assert (kernel.running_msg_id, kernel.execution_count) == (REQ, 4)
    assert "".join(collector.stdout) == "hello\n"
    assert "".join(collector.stderr) == "careful\n"
    assert [r.text for r in collector.results] == ["<Figure>", "42"]
    assert collector.results[0].png is not None


async def test_an_error_makes_the_outcome_error_with_the_traceback() -> None:
    channel = ScriptedChannel(
        [
            msg("execute_input", {"execution_count": 2}),
            msg(
                "error",
                {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["tb line"]},
            ),
            idle(),
        ],
        [reply(2)],
    )
    collector = OutputCollector(10_000)
    outcome = await run_request(channel, State(), "1/0", collector)
    assert (outcome.kind, outcome.execution_count) == ("error", 2)
    assert collector.error is not None
    assert (collector.error.name, collector.error.value) == ("ZeroDivisionError", "division by zero")


async def test_a_silent_run_is_sent_off_the_record_and_leaves_the_kernels_count() -> None:
    channel = ScriptedChannel([stream("set up\n"), idle()], [reply(7)])
    kernel = State(6)
    outcome = await run_request(channel, kernel, "setup()", OutputCollector(1000), silent=True)
    assert channel.sent == [("setup()", True, False)]
    assert (outcome.kind, outcome.execution_count) == ("ok", 7)
    assert kernel.execution_count == 6  # a silent run is no visible call


async def test_a_run_off_the_record_still_reports_its_count_to_the_kernel() -> None:
    channel = ScriptedChannel([idle()], [reply(9)])
    kernel = State(8)
    await run_request(channel, kernel, "0", OutputCollector(100), store_history=False)
    assert channel.sent == [("0", False, False)]
    assert kernel.execution_count == 9


async def test_messages_of_other_requests_are_skipped_their_idle_too() -> None:
    channel = ScriptedChannel(
        [stream("old\n", parent="req-0"), idle("req-0"), idle(None), stream("mine\n"), idle()],
        [reply(1, parent="req-0"), reply(2)],
    )
    collector = OutputCollector(1000)
    outcome = await run_request(channel, State(), "x", collector)
    assert "".join(collector.stdout) == "mine\n"
    assert (outcome.kind, outcome.execution_count) == ("ok", 2)


async def test_a_kernel_that_dies_mid_run_returns_died_with_the_output_so_far() -> None:
    channel = ScriptedChannel(
        [msg("execute_input", {"execution_count": 5}), stream("working\n"), KernelLost("died", exit_code=-9)]
    )
    kernel, collector = State(4), OutputCollector(1000)
    outcome = await run_request(channel, kernel, "boom()", collector)
    assert (outcome.kind, outcome.exit_code, outcome.execution_count) == ("died", -9, 5)
    assert "".join(collector.stdout) == "working\n"
    assert kernel.execution_count == 4


async def test_a_kernel_lost_before_the_request_is_sent_says_why() -> None:
    class Lost(ScriptedChannel):
        def send(self, code: str, *, silent: bool, store_history: bool) -> str:
            raise KernelLost("died", detail="the gateway is gone")

    kernel = State()
    outcome = await run_request(Lost([]), kernel, "x", OutputCollector(100))
    assert (outcome.kind, outcome.detail) == ("died", "the gateway is gone")
    assert kernel.running_msg_id is None


async def test_the_deadline_returns_the_output_so_far_without_waiting_for_a_reply() -> None:
    channel = ScriptedChannel([stream("tick\n")], [reply(3)])
    collector = OutputCollector(1000)
    with anyio.fail_after(60):  # a hang bound only; that no reply was waited for is asserted below
        outcome = await run_request(channel, State(), "loop()", collector, deadline=time.monotonic() + 0.2)
    assert outcome.kind == "deadline"
    assert "".join(collector.stdout) == "tick\n"
    assert channel.replies == [reply(3)]  # not read


async def test_after_idle_the_deadline_no_longer_applies() -> None:
    class SlowReply(ScriptedChannel):
        async def reply(self, timeout: float) -> Any:
            await anyio.sleep(0.3)
            return reply(5)

    outcome = await run_request(
        SlowReply([idle()]), State(), "x", OutputCollector(100), deadline=time.monotonic() + 0.1
    )
    assert (outcome.kind, outcome.execution_count) == ("ok", 5)


async def test_a_missing_reply_is_waited_for_only_a_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "REPLY_GRACE", 0.1)
    channel = ScriptedChannel([msg("execute_input", {"execution_count": 3}), idle()], [reply(99, "other")])
    kernel = State()
    outcome = await run_request(channel, kernel, "x", OutputCollector(100))
    assert (outcome.kind, outcome.execution_count, kernel.execution_count) == ("ok", 3, 3)


class Probed(ScriptedChannel):
    """A channel whose kernel answers a silent probe (``probe_answers``) with its idle status."""

    probe_answers = True

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        self.sent.append((code, silent, store_history))
        if not self.sent[:-1]:
            return REQ
        if self.probe_answers:
            self.outputs.append(idle("probe"))
        return "probe"


async def test_a_request_whose_idle_status_was_lost_ends_at_its_reply_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flood of output can make a subscriber's queue drop messages, the idle status among them:
    once no output came for a moment and the reply is there, the request is over (not at the
    time limit); a silent probe shows the kernel's messages arrive again, so the kernel stays,
    and the result says output from the request's last moments may be missing."""
    monkeypatch.setattr(exchange, "IDLE_LOST_AFTER", 0.1)
    channel = Probed([busy(), stream("line 1\n"), stream("line 2\n")], [reply(7, "other"), reply(7)])
    kernel, collector = State(), OutputCollector(100)
    with anyio.fail_after(5):
        outcome = await run_request(channel, kernel, "flood()", collector, deadline=time.monotonic() + 60)
    assert (outcome.kind, outcome.execution_count, kernel.execution_count) == ("ok", 7, 7)
    assert channel.sent[1] == ("0", True, False)  # the probe: silent, off the record
    assert "".join(collector.stdout) == "line 1\nline 2\n"
    assert outcome.idle_lost
    note = outcome.ignored_note()
    assert note is not None and "never arrived" in note


async def test_a_kernel_whose_messages_stopped_arriving_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's idle does not come either: the outcome is ``died`` with a sentence (the runner
    replaces the interpreter), before the time limit."""
    monkeypatch.setattr(exchange, "IDLE_LOST_AFTER", 0.1)
    monkeypatch.setattr(exchange, "PROBE_GRACE", 0.2)
    channel = Probed([stream("before\n")], [reply(3)])
    channel.probe_answers = False
    with anyio.fail_after(5):
        outcome = await run_request(
            channel, State(), "x", OutputCollector(100), deadline=time.monotonic() + 60
        )
    assert (outcome.kind, outcome.detail) == ("died", exchange.STREAM_LOST)


async def test_a_quiet_request_without_its_reply_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell that prints nothing for a while is not over until its reply (or idle) comes."""
    monkeypatch.setattr(exchange, "IDLE_LOST_AFTER", 0.05)
    started = time.monotonic()

    class LateReply(Probed):
        async def reply(self, timeout: float) -> Any:
            if time.monotonic() - started < 0.5:
                await anyio.sleep(timeout)
                return None
            return reply(2)

    with anyio.fail_after(5):
        outcome = await run_request(LateReply([]), State(), "sleep()", OutputCollector(100))
    assert time.monotonic() - started >= 0.5
    assert (outcome.kind, outcome.execution_count, outcome.idle_lost) == ("ok", 2, True)


async def test_malformed_messages_are_counted_and_the_rest_is_shown() -> None:
    channel = ScriptedChannel(
        [
            KeyError("msg_id"),
            ["not", "a", "message"],
            {"msg_type": "stream", "parent_header": [1], "content": {}},
            stream("still here\n"),
            idle(),
        ],
        [ValueError("bad frame"), reply(1)],
    )
    collector = OutputCollector(1000)
    outcome = await run_request(channel, State(), "x", collector)
    assert (outcome.kind, outcome.execution_count, outcome.ignored) == ("ok", 1, 4)
    assert outcome.ignored_why == "KeyError: 'msg_id'"
    assert "4 malformed Jupyter messages" in (outcome.ignored_note() or "")
    assert "".join(collector.stdout) == "still here\n"


async def test_a_kernel_closed_after_idle_still_returns_the_result_but_one_that_died_does_not() -> None:
    closed = ScriptedChannel([stream("done\n"), idle()], [KernelLost("closed")])
    outcome = await run_request(closed, State(), "x", OutputCollector(100))
    assert outcome.kind == "ok"
    died = ScriptedChannel([idle()], [KernelLost("died", detail="restarted")])
    outcome = await run_request(died, State(), "x", OutputCollector(100))
    assert (outcome.kind, outcome.detail) == ("died", "restarted")


async def test_an_interrupted_request_is_back_at_its_own_idle() -> None:
    channel = ScriptedChannel(
        [busy("interrupt-1"), idle("interrupt-1"), stream("KeyboardInterrupt\n", "stderr"), idle()]
    )
    sink = OutputCollector(1000)
    assert await await_interrupted(channel, REQ, sink, grace=1.0)
    assert "".join(sink.stderr) == "KeyboardInterrupt\n"


@pytest.mark.parametrize(
    "script",
    [[stream("still running\n")], [KernelLost("died", exit_code=-9)], [RuntimeError("sockets closed")]],
    ids=["no-idle-within-grace", "lost", "channel-failed"],
)
async def test_an_interrupt_that_does_not_bring_the_request_back_is_false(script: list[Any]) -> None:
    assert not await await_interrupted(ScriptedChannel(script), REQ, OutputCollector(100), grace=0.2)


# --- The local kernel's channel, over a scripted ZeroMQ client -----------------------------------


class ScriptedClient:
    """The part of jupyter_client's ``AsyncKernelClient`` a kernel's channel uses, over real
    ZeroMQ sockets: the script's messages are signed by a real ``Session`` and sent from the
    other end of in-process socket pairs; those after an ``Empty()`` entry come 0.1 s later."""

    def __init__(self, iopub: list[Any], shell: list[Any]) -> None:
        import zmq
        import zmq.asyncio
        from jupyter_client.session import Session

        self.session = Session(key=b"scripted-key")
        self.context = zmq.asyncio.Context()
        self.context.linger = 0  # what a test leaves unread never holds up its end
        self.iopub_channel, self.shell_channel = (
            SimpleNamespace(socket=self.context.socket(zmq.PAIR), session=self.session) for _ in range(2)
        )
        self.executed: list[dict[str, Any]] = []
        self.senders: dict[str, Any] = {}  # (held: a sender collected would leave its pair unconnected)
        for name, channel, script in (
            ("iopub", self.iopub_channel, iopub),
            ("shell", self.shell_channel, shell),
        ):
            channel.socket.bind(f"inproc://{id(self)}-{name}")
            sender = self.context.socket(zmq.PAIR, socket_class=zmq.Socket)
            sender.connect(f"inproc://{id(self)}-{name}")
            self.senders[name] = sender
            now, later = script, []
            if any(isinstance(entry, Empty) for entry in script):
                gap = next(i for i, entry in enumerate(script) if isinstance(entry, Empty))
                now, later = script[:gap], script[gap + 1 :]
            for entry in now:
                self._send(sender, entry)
            if later:
                threading.Timer(0.1, lambda s=sender, rest=later: [self._send(s, e) for e in rest]).start()

    def _send(self, sender: Any, entry: dict[str, Any]) -> None:
        from jupyter_client.session import Session

        session = Session(key=b"another-key") if entry.get("forged") else self.session
        session.send(sender, entry["msg_type"], content=entry["content"], parent=entry["parent_header"])

    def execute(self, code: str, **kw: Any) -> str:
        self.executed.append({"code": code, **kw})
        return REQ

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
def scripted_client() -> Iterator[Callable[[list[Any], list[Any]], ScriptedClient]]:
    made: list[ScriptedClient] = []

    def make(iopub: list[Any], shell: list[Any]) -> ScriptedClient:
        made.append(ScriptedClient(iopub, shell))
        return made[-1]

    yield make
    for client in made:
        client.close()


class ScriptedProcess:
    def __init__(self) -> None:
        self.alive, self.code = True, None

    async def is_alive(self) -> bool:
        return self.alive

    async def poll(self) -> int | None:
        return self.code


async def output_arrived(collector: OutputCollector) -> None:
    """Wait until the call under test has read its first output: it is in flight (not a time)."""
    with anyio.fail_after(60):
        while not collector.stdout:  # noqa: ASYNC110 - the collector has no event to wait on
            await anyio.sleep(0.005)


def local_kernel(client: ScriptedClient, tmp_path: Path) -> tuple[Kernel, ScriptedProcess]:
    process = ScriptedProcess()
    km = SimpleNamespace(is_alive=process.is_alive, provisioner=process)
    kernel = Kernel(id="k", workspace=Workspace(tmp_path), runtime_dir=tmp_path, km=km, uid=None, kc=client)  # type: ignore[arg-type]
    return kernel, process


async def test_a_local_kernel_runs_through_the_shared_loop(tmp_path: Path, scripted_client: Any) -> None:
    client = scripted_client([stream("hi\n"), Empty(), idle()], [reply(1)])
    kernel, _ = local_kernel(client, tmp_path)
    collector = OutputCollector(100)
    outcome = await kernel.execute("print('hi')", collector, silent=False)
    assert (outcome.kind, outcome.execution_count, kernel.execution_count) == ("ok", 1, 1)
    assert client.executed == [
        {"code": "print('hi')", "silent": False, "store_history": True, "allow_stdin": False}
    ]
    assert "".join(collector.stdout) == "hi\n"


async def test_a_local_kernel_reads_signed_messages_only_and_leaves_their_dates_as_sent(
    tmp_path: Path, scripted_client: Any
) -> None:
    forged = {**stream("not from the kernel\n"), "forged": True}
    client = scripted_client([forged, stream("from the kernel\n"), idle()], [reply(2)])
    kernel, _ = local_kernel(client, tmp_path)
    collector = OutputCollector(100)
    outcome = await kernel.execute("x", collector)
    assert (outcome.kind, outcome.execution_count, outcome.ignored) == ("ok", 2, 1)
    assert (outcome.ignored_why or "").startswith("ValueError: Invalid Signature")
    assert "".join(collector.stdout) == "from the kernel\n"
    channel = kernel.channel()
    client._send(client.senders["iopub"], stream("dated\n"))
    message = await channel.output(1.0)
    assert isinstance(message["header"]["date"], str)  # not parsed: nothing reads it


async def test_a_flood_of_waiting_messages_still_lets_other_tasks_run(
    tmp_path: Path, scripted_client: Any
) -> None:
    """Messages already waiting are read without awaiting; every ``READS_PER_YIELD`` of them
    the event loop gets a turn, so another client's call is not held up by a flood."""
    flood = 20 * READS_PER_YIELD
    client = scripted_client([*(stream("x") for _ in range(flood)), idle()], [reply(1)])
    kernel, _ = local_kernel(client, tmp_path)
    turns, running = 0, True

    async def other_task() -> None:
        nonlocal turns
        while running:
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_task)
        await anyio.lowlevel.checkpoint()  # it has started
        before = turns
        outcome = await kernel.execute("flood()", OutputCollector(10 * flood))
        during = turns - before
        running = False
    assert outcome.kind == "ok"
    assert during >= flood // READS_PER_YIELD - 1


async def test_a_local_kernel_whose_process_dies_is_noticed_by_its_poll(
    tmp_path: Path, scripted_client: Any
) -> None:
    client = scripted_client([stream("working\n")], [])
    kernel, process = local_kernel(client, tmp_path)
    collector = OutputCollector(100)

    async def die_mid_call() -> None:
        await output_arrived(collector)
        process.alive, process.code = False, -9

    # The kernel sends nothing more: without the poll the call would wait forever (the bound catches that).
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(die_mid_call)
            outcome = await kernel.execute("work()", collector)
    assert (outcome.kind, outcome.exit_code) == ("died", -9)


async def test_a_local_kernel_shut_down_under_the_call_is_closed(
    tmp_path: Path, scripted_client: Any
) -> None:
    client = scripted_client([stream("working\n")], [])
    kernel, _ = local_kernel(client, tmp_path)
    collector = OutputCollector(100)

    async def close_mid_call() -> None:
        await output_arrived(collector)
        kernel.closed = True

    with anyio.fail_after(60):  # a hang bound only
        async with anyio.create_task_group() as tg:
            tg.start_soon(close_mid_call)
            outcome = await kernel.execute("work()", collector)
    assert outcome.kind == "closed"


# --- The gateway kernel's channel, over a scripted WebSocket -------------------------------------


class ScriptedSocket:
    """The part of ``gateway.client.KernelChannels`` a gateway kernel uses."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.executed: list[tuple[str, bool, bool]] = []
        self.closed = False

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
        if self.closed:
            raise ChannelsClosed("the kernel's connection is closed")
        self.executed.append((code, silent, store_history))
        return REQ

    async def receive(self, timeout: float | None = None) -> Any:
        until = time.monotonic() + (timeout or 0)
        while not self.script:  # (what is added meanwhile arrives, as on a socket)
            if time.monotonic() >= until:
                return None
            await anyio.sleep(0.01)
        entry = self.script.pop(0)
        if isinstance(entry, BaseException):
            if isinstance(entry, ChannelsClosed):
                self.closed = True
            raise entry
        return entry

    def close(self) -> None:
        self.closed = True


def gateway_kernel(socket: ScriptedSocket, tmp_path: Path) -> GatewayKernel:
    gateway = SimpleNamespace(config=SimpleNamespace(base="http://127.0.0.1:8888"))
    return GatewayKernel("g", Workspace(tmp_path), socket, gateway)  # type: ignore[arg-type]


async def test_a_gateway_reply_that_comes_before_idle_is_kept(tmp_path: Path) -> None:
    socket = ScriptedSocket([stream("hi\n"), reply(6), msg("comm_open", channel="control"), idle()])
    kernel = gateway_kernel(socket, tmp_path)
    collector = OutputCollector(100)
    outcome = await kernel.execute("print('hi')", collector)
    assert (outcome.kind, outcome.execution_count, kernel.execution_count) == ("ok", 6, 6)
    assert "".join(collector.stdout) == "hi\n"


async def test_output_read_while_looking_for_a_gateway_reply_is_kept(tmp_path: Path) -> None:
    socket = ScriptedSocket([stream("late\n")])
    channel = gateway_kernel(socket, tmp_path).channel()
    assert await channel.reply(0.0) is None  # an output message came instead of a reply
    assert await channel.output(0.0) == stream("late\n")


async def test_a_gateway_request_whose_idle_was_lost_ends_at_its_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exchange, "IDLE_LOST_AFTER", 0.1)

    class AnswersProbes(ScriptedSocket):
        def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
            msg_id = super().execute(code, silent=silent, store_history=store_history)
            if len(self.executed) > 1:
                self.script.append(idle())  # the probe's idle (the scripted socket has one id)
            return msg_id

    socket = AnswersProbes([stream("x\n"), reply(6)])
    kernel = gateway_kernel(socket, tmp_path)
    collector = OutputCollector(100)
    with anyio.fail_after(5):
        outcome = await kernel.execute("flood()", collector, deadline=time.monotonic() + 60)
    assert (outcome.kind, outcome.execution_count, outcome.idle_lost) == ("ok", 6, True)
    assert "".join(collector.stdout) == "x\n"


async def test_a_gateway_restart_notice_ends_the_call_as_died_and_the_kernel_as_lost(tmp_path: Path) -> None:
    socket = ScriptedSocket(
        [stream("working\n"), msg("status", {"execution_state": "restarting"}, parent=None)]
    )
    kernel = gateway_kernel(socket, tmp_path)
    outcome = await kernel.execute("crash()", OutputCollector(100))
    assert outcome.kind == "died"
    assert (
        outcome.detail
        == "the Python interpreter died while running this code (the kernel gateway restarted it)"
    )
    assert not await kernel.is_alive()
    again = await kernel.execute("1", OutputCollector(100))
    assert (again.kind, again.detail) == ("died", outcome.detail)
    assert socket.executed == [("crash()", False, True)]  # nothing sent to a lost kernel


async def test_a_closed_gateway_connection_is_died_unless_we_closed_it(tmp_path: Path) -> None:
    lost = gateway_kernel(ScriptedSocket([ChannelsClosed("code 1006")]), tmp_path)
    outcome = await lost.execute("x", OutputCollector(100))
    assert outcome.kind == "died"
    assert (
        outcome.detail == "the connection to the kernel gateway at http://127.0.0.1:8888 was lost (code 1006)"
    )
    ours = gateway_kernel(ScriptedSocket([stream("x\n")]), tmp_path)
    collector = OutputCollector(100)

    async def close_mid_call() -> None:
        await output_arrived(collector)
        ours.closed = True
        ours.channels.script.append(ChannelsClosed("closed by us"))  # type: ignore[attr-defined]

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_mid_call)
        outcome = await ours.execute("x", collector, deadline=time.monotonic() + 60)
    assert outcome.kind == "closed"
    assert ours.lost is None

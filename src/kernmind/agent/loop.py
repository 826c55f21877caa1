"""The agent loop: model step, tool calls through MCP, results back, repeat.

Design: :class:`Agent` owns the conversation (``messages``, without the system message),
a :class:`ChatModel` and a :class:`ToolHub`. ``await agent.run(text)`` is one user turn:

1. compile the system prompt — the base prompt, each server's instructions and the memory
   blocks, read fresh so an edit made in the previous step shows in this one;
2. send the conversation with every MCP tool as a function schema;
3. if the answer has no tool calls, the turn is over; otherwise parse and approve each call
   (in order), run the approved ones concurrently, append one ``tool`` message per call
   (in the order the model made them) and, after them, one ``user`` message carrying the
   images the tools returned;
4. repeat until the model answers without tools or ``max_steps`` model steps were taken.

What happens along the way is reported to an :class:`AgentEvents` (the CLI prints it;
the default does nothing), and every call is kept as a :class:`ToolCallRecord`.

Error policy: the model must be able to correct itself, so arguments that are not JSON,
unknown tool names, refused approvals and tool errors all become tool results that say
what went wrong — never exceptions. The model endpoint failing after its retries raises
:class:`ModelError` out of ``run`` (the user's message stays in the conversation).
:meth:`Agent.interrupt` (Ctrl-C in the CLI) cancels whatever is in flight: running tool
calls are cancelled through MCP (which interrupts the kernel) and recorded as cancelled,
a model request is abandoned, and ``run`` returns with ``stopped == "interrupted"``; the
conversation stays valid, so the next ``run`` continues it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import anyio
import mcp_types as types

from kernmind.agent.config import AgentConfig
from kernmind.agent.connections import ToolHub, error_result
from kernmind.agent.memory import compile_memory
from kernmind.agent.model import AssistantTurn, ChatModel, ModelError, ToolCallRequest, parse_arguments
from kernmind.agent.results import ToolOutput, convert_result, image_note

log = logging.getLogger(__name__)

StopReason = Literal["answer", "max_steps", "interrupted"]
CallStatus = Literal["ok", "error", "refused", "cancelled"]

CANCELLED_TEXT = "The user cancelled this tool call (Ctrl-C) before it finished; its result is unknown."
REFUSED_TEXT = "The user declined this tool call. Do not retry it unchanged; ask the user or try another way."


@dataclass
class ToolCallRecord:
    """One tool call: what the model asked for and what came back."""

    id: str
    name: str
    raw_arguments: str
    step: int
    arguments: dict[str, Any] | None = None
    status: CallStatus = "ok"
    output: str = ""
    images: int = 0
    duration_s: float = 0.0
    _images: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_images", None)
        return data


@dataclass
class TurnResult:
    """The outcome of one user turn."""

    answer: str
    stopped: StopReason
    steps: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "stopped": self.stopped,
            "steps": self.steps,
            "tool_calls": [c.to_json() for c in self.tool_calls],
        }


class AgentEvents:
    """Hooks for what the loop does; override what you need (all are no-ops by default)."""

    async def on_step(self, step: int) -> None: ...

    async def on_token(self, text: str) -> None: ...

    async def on_assistant(self, turn: AssistantTurn, step: int) -> None: ...

    async def on_retry(self, attempt: int, delay: float, reason: str) -> None: ...

    async def approve(self, call: ToolCallRecord) -> bool:
        """Whether this tool call may run (the CLI asks the user when ``--approve``)."""
        return True

    async def on_tool_start(self, call: ToolCallRecord) -> None: ...

    async def on_tool_progress(
        self, call: ToolCallRecord, progress: float, total: float | None, message: str | None
    ) -> None: ...

    async def on_tool_end(self, call: ToolCallRecord) -> None: ...

    async def on_max_steps(self, steps: int) -> None: ...


class Agent:
    """An OpenAI-compatible chat model driving MCP servers. Use as ``async with Agent(cfg) as a``."""

    def __init__(self, config: AgentConfig, events: AgentEvents | None = None) -> None:
        self.config = config
        self.events = events or AgentEvents()
        self.messages: list[dict[str, Any]] = []
        self.runs: list[TurnResult] = []
        self.last_system_prompt: str = ""
        self.images_enabled = config.images != "off"
        self.hub = ToolHub(config.servers)
        self.model: ChatModel | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._interrupted = False
        self.busy = False

    async def __aenter__(self) -> Agent:
        self.model = ChatModel(
            self.config.model,
            base_url=self.config.base_url,
            api_key=self.config.api_key,
            max_retries=self.config.max_retries,
            retry_base_delay=self.config.retry_base_delay,
            retry_max_delay=self.config.retry_max_delay,
            timeout=self.config.request_timeout,
            temperature=self.config.temperature,
        )
        try:
            await self.hub.__aenter__()
        except BaseException:
            await self.model.aclose()
            raise
        if self.config.recorder is not None:
            await self.config.recorder.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.config.recorder is not None:
            with anyio.CancelScope(shield=True):
                await self.config.recorder.close()
        await self.hub.__aexit__(*exc)
        if self.model is not None:
            with anyio.CancelScope(shield=True):
                await self.model.aclose()

    # ----- public API -------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation (memory blocks live on the server and are kept)."""
        self.messages.clear()

    @property
    def interrupting(self) -> bool:
        """True between :meth:`interrupt` and the end of the turn it interrupted."""
        return self.busy and self._interrupted

    def interrupt(self) -> bool:
        """Cancel the model request or tool calls in flight; ``False`` when idle."""
        if not self.busy:
            return False
        self._interrupted = True
        for scope in list(self._scopes):
            scope.cancel()
        return True

    async def system_prompt(self) -> str:
        """The system prompt the next step will send (memory read fresh)."""
        parts = [self.config.system_prompt.strip()]
        if self.config.include_server_instructions:
            for conn in self.hub.connections:
                text = conn.client.instructions
                if text:
                    parts.append(
                        f'<server_instructions server="{conn.name}">\n{text.strip()}\n</server_instructions>'
                    )
        memory = await compile_memory(self.hub.connections)
        if memory:
            parts.append(memory)
        return "\n\n".join(p for p in parts if p)

    async def memory(self) -> str:
        return await compile_memory(self.hub.connections)

    async def run(self, user_message: str) -> TurnResult:
        """One user turn: steps until the model answers without tools, or the step limit."""
        if self.model is None:
            raise RuntimeError("use the Agent inside 'async with'")
        if self.busy:
            raise RuntimeError("this agent is already running a turn; await it (or interrupt it) first")
        self.busy = True
        self._interrupted = False
        result = TurnResult(answer="", stopped="answer", steps=0)
        self.runs.append(result)
        await self._keep({"role": "user", "content": user_message})
        try:
            for step in range(1, self.config.max_steps + 1):
                result.steps = step
                await self.events.on_step(step)
                turn = await self._model_step()
                if turn is None:
                    result.stopped = "interrupted"
                    return result
                await self._keep(turn.as_message())
                await self.events.on_assistant(turn, step)
                if not turn.tool_calls:
                    result.answer = turn.content
                    return result
                records = await self._tool_step(turn.tool_calls, step)
                result.tool_calls.extend(records)
                if self._interrupted:
                    result.stopped = "interrupted"
                    return result
            result.stopped = "max_steps"
            result.answer = (
                f"[stopped: reached the step limit ({self.config.max_steps} model steps) "
                "before the model gave a final answer]"
            )
            await self.events.on_max_steps(self.config.max_steps)
            return result
        finally:
            self.busy = False

    async def _keep(self, message: dict[str, Any]) -> None:
        """Append to the conversation, and record it (conversation memory) when configured."""
        self.messages.append(message)
        if self.config.recorder is not None:
            with anyio.CancelScope(shield=True):  # an interrupted turn still records what was said
                await self.config.recorder.record(message)

    def transcript(self) -> dict[str, Any]:
        """A JSON-serialisable record of the whole session (image data elided)."""
        return {
            "model": self.config.model,
            "base_url": self.model.endpoint if self.model else self.config.base_url,
            "servers": [c.name for c in self.hub.connections],
            "tools": sorted(self.hub.tools),
            "system_prompt": self.last_system_prompt,
            "messages": [_elide_images(m) for m in self.messages],
            "runs": [r.to_json() for r in self.runs],
        }

    # ----- one model step -----------------------------------------------------------

    async def _model_step(self) -> AssistantTurn | None:
        assert self.model is not None
        system = await self.system_prompt()
        self.last_system_prompt = system
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                if self._interrupted:
                    scope.cancel()
                return await self._complete(system)
            finally:
                self._scopes.discard(scope)
        return None  # interrupted

    async def _complete(self, system: str) -> AssistantTurn:
        assert self.model is not None
        for _ in range(2):
            outgoing = [{"role": "system", "content": system}, *self._outgoing_messages()]
            try:
                return await self.model.complete(
                    outgoing,
                    self.hub.function_schemas(),
                    stream=self.config.stream,
                    on_token=self.events.on_token,
                    on_retry=self.events.on_retry,
                )
            except ModelError as exc:
                if not (exc.images_rejected and self.config.images == "auto" and self.images_enabled):
                    raise
                log.warning("the model rejected image input; sending text notes instead of images")
                self.images_enabled = False
        raise AssertionError("unreachable")

    def _outgoing_messages(self) -> list[dict[str, Any]]:
        if self.images_enabled:
            return self.messages
        return [_images_as_notes(m) for m in self.messages]

    # ----- one tool step --------------------------------------------------------------

    async def _tool_step(self, calls: list[ToolCallRequest], step: int) -> list[ToolCallRecord]:
        records = [ToolCallRecord(id=c.id, name=c.name, raw_arguments=c.arguments, step=step) for c in calls]
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                if self._interrupted:
                    scope.cancel()
                runnable = [rec for rec in records if await self._prepare(rec)]
                async with anyio.create_task_group() as tg:
                    for rec in runnable:
                        tg.start_soon(self._run_call, rec)
            finally:
                self._scopes.discard(scope)
        for rec in records:
            if not rec.output:  # never finished: cancelled by interrupt()
                rec.status, rec.output = "cancelled", CANCELLED_TEXT
                await self.events.on_tool_end(rec)

        image_parts: list[dict[str, Any]] = []
        for rec in records:
            await self._keep({"role": "tool", "tool_call_id": rec.id, "content": rec.output})
            if rec._images:
                image_parts.append(
                    {"type": "text", "text": f"Images returned by {rec.name} (call {rec.id}):"}
                )
                image_parts += [{"type": "image_url", "image_url": {"url": url}} for url in rec._images]
        if image_parts:
            await self._keep({"role": "user", "content": image_parts})
        return records

    async def _prepare(self, rec: ToolCallRecord) -> bool:
        """Parse and approve a call; ``False`` (with ``rec`` finished) when it must not run."""
        args, problem = parse_arguments(rec.raw_arguments)
        if problem is not None:
            self._finish(
                rec, convert_result(error_result(f"Error calling {rec.name}: {problem}"), max_chars=4000)
            )
        elif rec.name not in self.hub.tools:
            self._finish(rec, convert_result(await self.hub.call(rec.name, {}), max_chars=4000))
        else:
            rec.arguments = args
            if await self.events.approve(rec):
                return True
            rec.status, rec.output = "refused", REFUSED_TEXT
        await self.events.on_tool_end(rec)
        return False

    async def _run_call(self, rec: ToolCallRecord) -> None:
        async def progress(value: float, total: float | None, message: str | None) -> None:
            await self.events.on_tool_progress(rec, value, total, message)

        await self.events.on_tool_start(rec)
        started = anyio.current_time()
        result: types.CallToolResult = await self.hub.call(
            rec.name, rec.arguments or {}, progress=progress, timeout=self.config.tool_timeout
        )
        rec.duration_s = anyio.current_time() - started
        self._finish(rec, convert_result(result, max_chars=self.config.max_tool_result_chars))
        await self.events.on_tool_end(rec)

    def _finish(self, rec: ToolCallRecord, out: ToolOutput) -> None:
        rec.status = "error" if out.is_error else "ok"
        rec.output = out.text
        rec.images = len(out.images)
        rec._images = out.images
        if out.images and not self.images_enabled:
            rec.output += "\n" + image_note(len(out.images), rec.name)
            rec._images = []


def _images_as_notes(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list) or not any(p.get("type") == "image_url" for p in content):
        return message
    count = sum(1 for p in content if p.get("type") == "image_url")
    texts = [p["text"] for p in content if p.get("type") == "text"]
    note = f"[{count} image(s) not shown: this model cannot view images] " + " ".join(texts)
    return {**message, "content": note.strip()}


def _elide_images(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for p in content:
        if p.get("type") == "image_url":
            url = p["image_url"]["url"]
            head = url.split(",", 1)[0]
            parts.append({"type": "image_url", "image_url": {"url": f"{head},<{len(url)} chars elided>"}})
        else:
            parts.append(p)
    return {**message, "content": parts}

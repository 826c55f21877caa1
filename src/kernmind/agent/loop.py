"""The agent loop: model step, tool calls through MCP, results back, repeat (docs/agent.md).

Design: ``run(text)`` is one user turn: the system prompt (base, servers' instructions, fresh memory
blocks, summary), the conversation (compacted first when it would not fit), approved tool calls run
concurrently and appended in the model's order, until an answer without tools or ``max_steps``.
Error policy: bad arguments, unknown tools, refusals and tool errors become tool results in words;
an endpoint failing after retries, or a request too long after two compactions, raises
``ModelError``; ``interrupt`` cancels what is in flight and leaves the conversation valid.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp_types as types

from kernmind.agent.compaction import CONVERSATION_SEARCH_NOTE, compact, summary_section
from kernmind.agent.config import AgentConfig
from kernmind.agent.connections import ToolHub, error_result
from kernmind.agent.endpoint import EndpointInfo, check_endpoint, endpoint_url
from kernmind.agent.memory import compile_memory
from kernmind.agent.model import AssistantTurn, ChatModel, ModelError, ToolCallRequest, parse_arguments
from kernmind.agent.recording import Recording
from kernmind.agent.records import AgentEvents, ToolCallRecord, TurnResult
from kernmind.agent.results import ToolOutput, convert_result, elide_images, image_note, images_as_notes
from kernmind.agent.window import (
    COMPACT_TO,
    DEFAULT_WINDOW,
    ContextWindow,
    choose_window,
    message_tokens,
    tools_tokens,
)

log = logging.getLogger(__name__)

CANCELLED_TEXT = "The user cancelled this tool call (Ctrl-C) before it finished; its result is unknown."
REFUSED_TEXT = "The user declined this tool call. Do not retry it unchanged; ask the user or try another way."


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
        self.endpoint: EndpointInfo | None = config.endpoint
        self.window = ContextWindow(config.context_window or DEFAULT_WINDOW, "--context-window")
        self.summary: str | None = None  # what the evicted messages said (compaction.py)
        self.evicted = 0  # messages evicted so far (all in the conversation record)
        self._overhead_noted = False
        self._scopes: set[anyio.CancelScope] = set()
        self._interrupted = False
        self.busy = False
        self._background = AsyncExitStack()
        self.recording: Recording | None = None

    async def __aenter__(self) -> Agent:
        cfg = self.config
        if cfg.check_endpoint and self.endpoint is None:  # before any server starts: fail fast
            self.endpoint = await check_endpoint(
                cfg.base_url, cfg.api_key, cfg.model, connect_timeout=cfg.connect_timeout
            )
        self.model = ChatModel(
            cfg.model,
            base_url=cfg.base_url,
            api_key=cfg.api_key,
            max_retries=cfg.max_retries,
            retry_base_delay=cfg.retry_base_delay,
            retry_max_delay=cfg.retry_max_delay,
            timeout=cfg.request_timeout,
            connect_timeout=cfg.connect_timeout,
            temperature=cfg.temperature,
        )
        tasks = await self._background.enter_async_context(anyio.create_task_group())
        if cfg.recorder is not None:
            # recording.py; its task group is entered before the hub's clients, exited after them
            self.recording = Recording(cfg.recorder)
            self.recording.start(tasks)
        self.window = choose_window(cfg.context_window, self.endpoint, cfg.model, endpoint_url(cfg.base_url))
        try:
            await self.hub.__aenter__()
        except BaseException:
            tasks.cancel_scope.cancel()  # the recorder never started: nothing to store
            await self._close_background()
            raise
        if self.recording is not None:
            self.recording.servers_up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.recording is not None:
            self.recording.close()  # the recorder stores what is queued while the servers stop
        try:
            await self.hub.__aexit__(*exc)
        finally:
            await self._close_background()

    async def _close_background(self) -> None:
        if self.recording is not None:
            self.recording.close()
        try:
            await self._background.aclose()  # waits for the recorder (it shields itself)
        finally:
            if self.model is not None:
                with anyio.CancelScope(shield=True):
                    await self.model.aclose()

    # ----- public API -------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation (memory blocks live on the server and are kept)."""
        self.messages.clear()
        self.summary, self.evicted = None, 0

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

    async def system_prompt(self, *, with_summary: bool = True) -> str:
        """The system prompt the next step will send (memory read fresh)."""
        parts = [self.config.system_prompt.strip()]
        if self.searchable:
            parts.append(CONVERSATION_SEARCH_NOTE)
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
        if with_summary:
            parts.append(summary_section(self.summary, self.evicted, self.searchable))
        return "\n\n".join(p for p in parts if p)

    @property
    def searchable(self) -> bool:
        """Whether the model can search the conversation record (kernmind's ``conversation_search``)."""
        return "conversation_search" in self.hub.tools

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
        compacted_before = len(self.window.compactions)
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
            result.compactions = len(self.window.compactions) - compacted_before
            self.busy = False

    async def _keep(self, message: dict[str, Any]) -> None:
        """Append to the conversation, and queue it for the recorder (conversation memory)."""
        self.messages.append(message)
        if self.recording is not None:
            self.recording.add(message)

    def transcript(self) -> dict[str, Any]:
        """A JSON-serialisable record of the whole session (image data elided)."""
        return {
            "model": self.config.model,
            "base_url": self.model.endpoint if self.model else self.config.base_url,
            "servers": [c.name for c in self.hub.connections],
            "tools": sorted(self.hub.tools),
            "system_prompt": self.last_system_prompt,
            "messages": [elide_images(m) for m in self.messages],
            "runs": [r.to_json() for r in self.runs],
            "context": {**self.window.to_json(), "summary": self.summary, "evicted_messages": self.evicted},
            "compactions": len(self.window.compactions),
        }

    # ----- one model step -----------------------------------------------------------

    async def _model_step(self) -> AssistantTurn | None:
        assert self.model is not None
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                if self._interrupted:
                    scope.cancel()
                return await self._complete()
            finally:
                self._scopes.discard(scope)
        return None  # interrupted

    async def _complete(self) -> AssistantTurn:
        """One request, compacted first when it would pass the threshold, and compacted and sent
        again (twice at most) when the endpoint answers that it is longer than the window."""
        assert self.model is not None
        tools = self.hub.function_schemas()
        tools_raw = tools_tokens(tools)
        compacted = False
        refusals = 0
        while True:
            system = await self.system_prompt()
            self.last_system_prompt = system
            messages = self._outgoing_messages()
            raw = self.window.raw_tokens(system, messages, tools_raw)
            await self._note_overhead(system, tools_raw)
            if self.window.tokens(raw) > self.window.threshold and not compacted:
                compacted = True
                await self._compact("threshold", COMPACT_TO, tools_raw)
                continue
            try:
                turn = await self.model.complete(
                    [{"role": "system", "content": system}, *messages],
                    tools,
                    stream=self.config.stream,
                    on_token=self.events.on_token,
                    on_retry=self.events.on_retry,
                )
            except ModelError as exc:
                if exc.images_rejected and self.config.images == "auto" and self.images_enabled:
                    log.warning("the model rejected image input; sending text notes instead of images")
                    self.images_enabled = False
                    continue
                if not exc.context_exceeded:
                    raise
                if refusals == 2:
                    raise ModelError(
                        self.window.does_not_fit(exc, system, tools_raw), status=exc.status
                    ) from exc
                refusals += 1
                self.window.learn(str(exc), raw)
                log.info("the endpoint says the request is too long (%s); compacting", exc)
                await self._compact(
                    "the endpoint said the request was too long", COMPACT_TO / refusals, tools_raw
                )
                compacted = True
                continue
            self.window.observe(raw, (turn.usage or {}).get("prompt_tokens"))
            return turn

    async def _compact(self, reason: str, share: float, tools_raw: int) -> None:
        if self.recording is not None:
            await self.recording.caught_up()  # what is evicted must already be findable
        system = await self.system_prompt(with_summary=False)
        done = await compact(
            self.messages,
            summary=self.summary,
            evicted_before=self.evicted,
            window=self.window,
            fixed=message_tokens({"content": system}) + tools_raw,
            target=int(self.window.size * share),
            summarize=self._summarize,
            searchable=self.searchable,
            reason=reason,
        )
        self.messages[:] = done.messages
        self.summary, self.evicted = done.summary, done.evicted_total
        await self.events.on_compaction(done.compaction)

    async def _summarize(self, request: list[dict[str, Any]]) -> str:
        assert self.model is not None
        turn = await self.model.complete(request, [], on_retry=self.events.on_retry)
        if turn.tool_calls:
            raise ModelError("the model answered the summary request with tool calls")
        return turn.content

    async def _note_overhead(self, system: str, tools_raw: int) -> None:
        """Say once when the system prompt and the tools' schemas leave little room for the conversation."""
        if not self._overhead_noted:
            self._overhead_noted = True
            if notice := self.window.crowded(system, tools_raw, len(self.hub.tools)):
                await self.events.on_notice(notice)

    def _outgoing_messages(self) -> list[dict[str, Any]]:
        if self.images_enabled:
            return self.messages
        return [images_as_notes(m) for m in self.messages]

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

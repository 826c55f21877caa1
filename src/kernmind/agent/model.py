"""The chat model: one OpenAI-compatible chat-completions request, streamed or not.

Design: streamed tool-call fragments are stitched by ``index``, tolerating servers that send a
whole call at once, omit ``index`` or repeat the ``id``. Error policy: retries are here (the
client's are off; 429, 408, 409, 5xx, broken connections, honouring ``Retry-After``); then
``ModelError`` names the status, endpoint and what the server said.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import openai
from openai import AsyncOpenAI

from kernmind.agent.errors import ModelError

log = logging.getLogger(__name__)

TokenCallback = Callable[[str], Awaitable[None] | None]
RetryCallback = Callable[[int, float, str], Awaitable[None] | None]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 522, 524, 529})
CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
CONTEXT_WORDS = re.compile(
    r"context[ _]length|maximum context|context window|context size|prompt is too long|too many tokens"
    r"|input is too long|exceeds? the (?:available |maximum )?context|reduce the length of the messages",
    re.I,
)


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # raw JSON text as the model sent it


@dataclass
class AssistantTurn:
    content: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return msg


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value


class ChatModel:
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 4,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 20.0,
        timeout: float = 600.0,
        connect_timeout: float = 3.0,
        temperature: float | None = None,
    ) -> None:
        self.model = model
        self.max_retries = max_retries
        self.stream_usage = True  # ask streams for usage until a server refuses the option
        self.retry_base_delay = retry_base_delay
        self.retry_max_delay = retry_max_delay
        self.temperature = temperature
        # Local servers (Ollama, vLLM, LM Studio) take any key; the client insists on one.
        key = api_key or ("not-needed" if base_url else None)
        if key is None and not os.environ.get("OPENAI_API_KEY"):
            raise ModelError(
                "no API key: set OPENAI_API_KEY, or point --base-url at a local OpenAI-compatible "
                "server (Ollama, vLLM, LM Studio) that needs none"
            )
        try:
            self._client = AsyncOpenAI(
                api_key=key,
                base_url=base_url,
                max_retries=0,
                timeout=openai.Timeout(timeout, connect=connect_timeout),
            )
        except openai.OpenAIError as exc:
            raise ModelError(f"cannot create the model client: {exc}") from exc
        self.endpoint = str(self._client.base_url).rstrip("/")

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        stream: bool = False,
        on_token: TokenCallback | None = None,
        on_retry: RetryCallback | None = None,
    ) -> AssistantTurn:
        """One model step, with retries; raises :class:`ModelError` when it cannot succeed."""
        attempt = 0
        while True:
            attempt += 1
            try:
                if stream:
                    return await self._streamed(messages, tools, on_token)
                return await self._plain(messages, tools)
            except openai.APIStatusError as exc:
                status = exc.status_code
                detail = _error_detail(exc)
                if stream and self.stream_usage and status in (400, 422) and "stream_options" in detail:
                    log.info("the endpoint refuses stream_options; streaming without usage figures")
                    self.stream_usage = False
                    attempt -= 1
                    continue
                if status not in RETRY_STATUSES or attempt > self.max_retries:
                    too_long = _context_exceeded(exc, detail)
                    raise ModelError(
                        self._failure(f"HTTP {status} {detail}", attempt),
                        status=status,
                        images_rejected=not too_long and status in (400, 415, 422) and _has_images(messages),
                        context_exceeded=too_long,
                    ) from exc
                delay = self._delay(attempt, exc.response.headers.get("retry-after"))
                reason = f"HTTP {status}" + (" (rate limited)" if status == 429 else "")
            except openai.APIConnectionError as exc:  # includes timeouts and broken streams
                if attempt > self.max_retries:
                    raise ModelError(self._failure(_connection_detail(exc), attempt)) from exc
                delay = self._delay(attempt, None)
                reason = _connection_detail(exc)
            log.info(
                "model request failed (%s); retry %d/%d in %.1fs", reason, attempt, self.max_retries, delay
            )
            if on_retry is not None:
                await _maybe_await(on_retry(attempt, delay, reason))
            await anyio.sleep(delay)

    def _failure(self, what: str, attempts: int) -> str:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return f"model request to {self.endpoint} (model {self.model!r}) failed{tries}: {what}"

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.retry_max_delay)
            except ValueError:
                pass
        base = self.retry_base_delay * (2 ** (attempt - 1))
        return min(base * (0.75 + random.random() / 2), self.retry_max_delay)

    def _params(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            params["tools"] = tools
        if self.temperature is not None:
            params["temperature"] = self.temperature
        return params

    async def _plain(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> AssistantTurn:
        resp = await self._client.chat.completions.create(**self._params(messages, tools))
        if not resp.choices:
            raise ModelError(self._failure("the response had no choices", 1))
        choice = resp.choices[0]
        msg = choice.message
        calls = [
            ToolCallRequest(
                id=c.id or f"call_{i}", name=c.function.name, arguments=c.function.arguments or ""
            )
            for i, c in enumerate(msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        usage = resp.usage.model_dump(include={"prompt_tokens", "completion_tokens"}) if resp.usage else None
        return AssistantTurn(msg.content or "", calls, choice.finish_reason, usage)

    async def _streamed(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], on_token: TokenCallback | None
    ) -> AssistantTurn:
        turn = AssistantTurn()
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if self.stream_usage else {}
        stream = await self._client.chat.completions.create(
            **self._params(messages, tools), stream=True, **extra
        )
        async with stream:
            async for chunk in stream:
                if chunk.usage:
                    turn.usage = chunk.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = choice.delta
                if delta.content:
                    parts.append(delta.content)
                    if on_token is not None:
                        await _maybe_await(on_token(delta.content))
                for pos, tc in enumerate(delta.tool_calls or []):
                    _merge_call_delta(calls, tc, pos)
                if choice.finish_reason:
                    turn.finish_reason = choice.finish_reason
        turn.content = "".join(parts)
        turn.tool_calls = [
            ToolCallRequest(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
            for i, c in sorted(calls.items())
            if c["name"]
        ]
        return turn


def _merge_call_delta(calls: dict[int, dict[str, Any]], tc: Any, pos: int) -> None:
    index = tc.index if tc.index is not None else pos
    fn = tc.function
    name = (fn.name if fn else None) or ""
    args = (fn.arguments if fn else None) or ""
    current = calls.get(index)
    # A new id at an index that already holds a complete call means the server reuses
    # indexes (some send every call at index 0): start a new slot.
    if current is not None and tc.id and current["id"] and tc.id != current["id"]:
        index = max(calls) + 1
        current = None
    if current is None:
        calls[index] = {"id": tc.id or "", "name": name, "arguments": args}
        return
    if tc.id and not current["id"]:
        current["id"] = tc.id
    if name and not current["name"]:
        current["name"] = name
    current["arguments"] += args


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    message: Any = None
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else err
    if not message:
        try:
            message = exc.response.text[:300]
        except Exception:
            message = None
    reason = exc.response.reason_phrase if hasattr(exc.response, "reason_phrase") else ""
    text = f"{reason}".strip()
    if message:
        text = f"{text}: {message}" if text else str(message)
    return text


def _context_exceeded(exc: openai.APIStatusError, detail: str) -> bool:
    """Whether the endpoint refused the request for being longer than the model's window."""
    body = exc.body if isinstance(exc.body, dict) else {}
    err = body.get("error", body)
    if isinstance(err, dict) and {str(err.get("code")), str(err.get("type"))} & CONTEXT_CODES:
        return True
    return exc.status_code in (400, 413, 422) and CONTEXT_WORDS.search(detail) is not None


def _connection_detail(exc: openai.APIConnectionError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "the request timed out"
    cause = exc.__cause__
    return f"connection failed ({cause or exc})"


def _has_images(messages: list[dict[str, Any]]) -> bool:
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
            return True
    return False


def parse_arguments(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """Tool-call arguments as a dict, or an error message the model can act on."""
    text = raw.strip()
    if not text:
        return {}, None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (
            f"the arguments are not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}). "
            "Call the tool again with a single JSON object that matches its parameter schema."
        )
    if not isinstance(value, dict):
        return None, (
            f"the arguments must be a JSON object, got {type(value).__name__}. "
            "Call the tool again with an object that matches its parameter schema."
        )
    return value, None

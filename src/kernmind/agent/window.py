"""The model's context window: how many tokens a request takes, and how full the window is.

Design: see docs/agent.md ("The window"); the estimate is checked by
benchmarks/bench_chars_per_token.py. Error policy: pure bookkeeping; nothing here raises.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernmind.agent.endpoint import EndpointInfo

DEFAULT_WINDOW = 32_768
COMPACT_AT = 0.75  # compact when a request would take more than this share of the window
COMPACT_TO = 0.5  # … down to this share, so that compaction does not come back every step
LETTERS_PER_TOKEN = 7
PUNCTUATION_PER_TOKEN = 2
MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 800  # a 512×512 image at high detail is 765 tokens for OpenAI's models
MIN_SCALE, MAX_SCALE = 0.5, 4.0
# OpenAI's /models says nothing about windows: the documented ones of its current families,
# longest prefix first.
OPENAI_WINDOWS = (
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("o4-mini", 200_000),
    ("o3", 200_000),
    ("o1", 200_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
)

_PIECE = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+|_+")
_WINDOW_IN_ERROR = re.compile(
    r"(?:maximum context length|context (?:length|window|size)) (?:is|of) ([\d,]+)", re.I
)
_REQUEST_IN_ERROR = re.compile(
    r"(?:resulted in|requested|prompt (?:is|has|contains)|request has|input has) ([\d,]+) tokens"
    r"|\(([\d,]+) in the messages",
    re.I,
)


@functools.lru_cache(maxsize=1024)  # messages are re-estimated every step: count each once
def text_tokens(text: str) -> int:
    """Estimated tokens of a text (see the module docstring)."""
    count = 0
    for match in _PIECE.finditer(text):
        piece = match.group().strip()
        if not piece:
            count += 1 if len(match.group()) < 8 else math.ceil(len(match.group()) / 8)
        elif piece[0].isalpha():
            count += math.ceil(len(piece) / LETTERS_PER_TOKEN)
        elif piece[0].isdigit():
            count += 1
        else:
            count += math.ceil(len(piece) / PUNCTUATION_PER_TOKEN)
    return count


def message_tokens(message: dict[str, Any]) -> int:
    """Estimated tokens of one chat message: its text, its tool calls and its images."""
    tokens = MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        tokens += text_tokens(content)
    elif isinstance(content, list):
        for part in content:
            if part.get("type") == "image_url":
                tokens += IMAGE_TOKENS
            else:
                tokens += text_tokens(str(part.get("text", "")))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        tokens += MESSAGE_OVERHEAD + text_tokens(fn.get("name", "")) + text_tokens(fn.get("arguments", ""))
    return tokens


def tools_tokens(schemas: list[dict[str, Any]]) -> int:
    return text_tokens(json.dumps(schemas, ensure_ascii=False)) if schemas else 0


def choose_window(given: int | None, endpoint: EndpointInfo | None, model: str, url: str) -> ContextWindow:
    """The window, from the first that says: the user, the endpoint's model list, OpenAI's documentation."""
    if given:
        return ContextWindow(given, "--context-window")
    if endpoint is not None and endpoint.context_window:
        return ContextWindow(endpoint.context_window, "the endpoint's model list")
    if known := known_window(model, url):
        return ContextWindow(known, "OpenAI's documented window for this model")
    return ContextWindow(DEFAULT_WINDOW, "default (the endpoint does not say)")


def known_window(model: str, endpoint_url: str) -> int | None:
    """The documented window of one of OpenAI's models on OpenAI's endpoint."""
    if "api.openai.com" not in endpoint_url:
        return None
    return next((size for prefix, size in OPENAI_WINDOWS if model.startswith(prefix)), None)


@dataclass
class Compaction:
    """What one compaction did (the CLI notes it on stderr; ``--json`` lists them)."""

    evicted: int  # messages taken out of the context (kept in the conversation record)
    shortened: int  # tool results cut in place to fit
    summarized: bool  # the model's summary replaced them (False: a plain note of what was dropped)
    before: int  # estimated tokens of the request before …
    after: int  # … and after
    window: int
    reason: str  # "threshold", or "the endpoint said the request was too long"
    note: str = ""  # why the summary was not used, when it was not

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ContextWindow:
    """The window's size and where it came from, the estimate's correction, and what happened."""

    size: int
    source: str  # "--context-window", "the endpoint (max_model_len)", "OpenAI's documented window", "default"
    scale: float = 1.0  # real tokens per estimated token, learnt from the endpoint
    last_estimate: int | None = None  # the last request, estimated (corrected)
    last_reported: int | None = None  # … and as the endpoint counted it
    compactions: list[Compaction] = field(default_factory=list)

    @property
    def threshold(self) -> int:
        return int(self.size * COMPACT_AT)

    def tokens(self, raw: int) -> int:
        """An estimate, corrected by what the endpoint has reported so far."""
        return math.ceil(raw * self.scale)

    def raw_tokens(self, system: str, messages: list[dict[str, Any]], tools: int) -> int:
        """Uncorrected estimate of a request: the system prompt, the messages, the tools' schemas."""
        return message_tokens({"content": system}) + sum(message_tokens(m) for m in messages) + tools

    def observe(self, raw: int, prompt_tokens: int | None) -> None:
        """The endpoint counted ``prompt_tokens`` for a request estimated at ``raw``: learn the scale."""
        self.last_estimate = self.tokens(raw)
        if not prompt_tokens or prompt_tokens <= 0 or raw <= 0:
            return
        self.last_reported = prompt_tokens
        seen = prompt_tokens / raw
        # too low is dangerous (the next request may overflow): follow at once; too high only wastes room
        self.scale = seen if seen > self.scale else (self.scale + seen) / 2
        self.scale = min(max(self.scale, MIN_SCALE), MAX_SCALE)

    def learn(self, error_text: str, raw: int) -> None:
        """Read the window and the request's size from a "context length exceeded" message."""
        if (m := _WINDOW_IN_ERROR.search(error_text)) and (size := int(m.group(1).replace(",", ""))) >= 256:
            if size < self.size:
                self.size, self.source = size, "the endpoint's error message"
        if m := _REQUEST_IN_ERROR.search(error_text):
            counted = int((m.group(1) or m.group(2)).replace(",", ""))
            if raw > 0 and counted > 0:
                self.scale = min(max(counted / raw, self.scale, MIN_SCALE), MAX_SCALE)
        else:  # it did not say: assume the estimate was at least a fifth too low
            self.scale = min(self.scale * 1.2, MAX_SCALE)

    def crowded(self, system: str, tools_raw: int, tool_count: int) -> str | None:
        """A notice when the system prompt and the tools' schemas take more than half the window."""
        fixed = self.tokens(message_tokens({"content": system}) + tools_raw)
        if fixed <= self.size / 2:
            return None
        return (
            f"the system prompt and the {tool_count} tools' schemas take ≈ {fixed:,} of the "
            f"model's {self.size:,}-token window: little room is left for the conversation "
            "(a model with a larger window, --context-window if it has one, or fewer MCP servers)"
        )

    def does_not_fit(self, error: object, system: str, tools_raw: int) -> str:
        """What to say when the endpoint still refuses a request after compacting it."""
        fixed = self.tokens(message_tokens({"content": system}) + tools_raw)
        return (
            f"the request does not fit the model's window even after compacting the conversation ({error}). "
            f"The system prompt and the tools' schemas alone take ≈ {fixed:,} tokens of "
            f"{self.size:,}: give the real window with --context-window, use a model with a larger "
            "one, or fewer MCP servers or a shorter --system"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.size,
            "window_source": self.source,
            "last_request_tokens": self.last_estimate,
            "last_request_tokens_reported": self.last_reported,
            "compactions": len(self.compactions),
            "compaction_log": [c.to_json() for c in self.compactions],
        }


def clip_to_tokens(text: str, tokens: int, note: str) -> str:
    """``text`` cut in the middle (head and tail kept, ``note`` between) to about ``tokens``."""
    have = text_tokens(text)
    if have <= tokens:
        return text
    keep = max(int(len(text) * max(tokens - text_tokens(note) - 8, 0) / have), 0)
    for _ in range(4):  # the estimate per character varies along the text: check and tighten
        head = keep * 2 // 3
        tail = keep - head
        cut = len(text) - keep
        out = f"{text[:head]}\n{note.format(cut=f'{cut:,}')}\n{text[len(text) - tail :] if tail else ''}"
        if text_tokens(out) <= tokens or keep == 0:
            return out
        keep = int(keep * 0.8)
    return out

"""Making the conversation fit the model's window: shorten old tool results, evict the oldest
turns in whole groups, and put a summary the model writes in their place (docs/agent.md).

Design: groups (a user message; an answer; tool calls with their results) are kept or evicted
whole, so no call is sent without its result. Error policy: a summary that fails
(``summary_problem``) is replaced by a plain note of what was dropped. Cancellation propagates.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kernmind.agent.window import (
    Compaction,
    ContextWindow,
    clip_to_tokens,
    message_tokens,
    text_tokens,
)

log = logging.getLogger(__name__)

OLD_RESULT_SHARE = 0.03  # an old tool result keeps at most this share of the window …
MIN_RESULT_TOKENS = 150  # … and never less than this
SUMMARY_SHARE = 0.12  # room for the summary in the system prompt
SUMMARY_INPUT_SHARE = 0.6  # what the summary request may take of the window
PINNED_SHARE = 0.2  # the current turn's request stays in view when it is at most this big
CUT_NOTE = "[… {cut} characters of this tool result cut to fit the context window …]"
CUT_NOTE_SEARCHABLE = (
    "[… {cut} characters of this tool result cut to fit the context window; "
    "conversation_search finds the whole result …]"
)

SUMMARY_PROMPT = """\
You are summarising the oldest part of a conversation between a user and an AI assistant \
that uses tools, so that the assistant can go on without it. Write in the first person, as \
the assistant ("The user asked me…", "I ran…"). Keep what later turns may need: the user's \
requests and preferences, facts, numbers, names, file and session names, what each tool call \
did and returned (errors too), decisions, and work still unfinished. Fold the earlier summary, \
if any, into yours. Leave out small talk and repetition. Use at most {words} words. Reply \
with the summary alone."""

CONVERSATION_SEARCH_NOTE = (
    "When a conversation grows longer than your context window, its oldest turns are replaced by a "
    "summary (shown in <conversation_summary>); every message stays in the conversation record, and "
    "conversation_search finds anything said earlier, word for word."
)

Summarize = Callable[[list[dict[str, Any]]], Awaitable[str]]


@dataclass
class Compacted:
    messages: list[dict[str, Any]]
    summary: str | None
    evicted_total: int
    compaction: Compaction


def groups(messages: list[dict[str, Any]]) -> list[list[int]]:
    """Indexes of ``messages`` in groups that are kept or evicted together (see the docstring)."""
    out: list[list[int]] = []
    i = 0
    while i < len(messages):
        group = [i]
        if messages[i].get("role") == "assistant" and messages[i].get("tool_calls"):
            while i + 1 < len(messages) and (
                messages[i + 1].get("role") == "tool" or _images_message(messages[i + 1])
            ):
                i += 1
                group.append(i)
        out.append(group)
        i += 1
    return out


def _images_message(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(p.get("type") == "image_url" for p in content)
    )


def summary_section(summary: str | None, evicted: int, searchable: bool) -> str:
    """What the system prompt carries in place of the evicted messages."""
    if not summary:
        return ""
    where = (
        " They are kept word for word in the conversation record: conversation_search finds them."
        if searchable
        else ""
    )
    return (
        f"<conversation_summary>\n{evicted} earlier messages of this conversation are not shown: they did "
        f"not fit the context window.{where} What they said:\n{summary.strip()}\n</conversation_summary>"
    )


def summary_problem(text: str) -> str | None:
    """Why a summary is unusable, or None when it reads like one."""
    stripped = text.strip()
    if not stripped:
        return "the model returned no text"
    words = re.findall(r"[^\W\d_]{2,}", stripped)
    if len(words) < 5:
        return f"the model's summary has {len(words)} word(s)"
    if len({w.lower() for w in words}) < max(4, len(words) // 10):
        return "the model's summary repeats a few words"
    letters = sum(c.isalpha() for c in stripped)
    visible = sum(not c.isspace() for c in stripped)
    if letters < visible / 2:
        return "the model's summary is not prose"
    return None


def dropped_note(evicted: list[dict[str, Any]], why: str, searchable: bool) -> str:
    """A plain account of what was evicted, for when there is no usable summary."""
    users = [m for m in evicted if m.get("role") == "user" and isinstance(m.get("content"), str)]
    calls: dict[str, int] = {}
    for m in evicted:
        for c in m.get("tool_calls") or []:
            name = c.get("function", {}).get("name", "?")
            calls[name] = calls.get(name, 0) + 1
    answers = sum(1 for m in evicted if m.get("role") == "assistant" and m.get("content"))
    parts = []
    if users:
        first = " ".join(str(users[0]["content"]).split())[:120]
        parts.append(f'{len(users)} user message(s), the first: "{first}"')
    if calls:
        parts.append("tool calls " + ", ".join(f"{n} ×{k}" for n, k in calls.items()) + " with their results")
    if answers:
        parts.append(f"{answers} assistant message(s) with text")
    find = " Use conversation_search to find what they said." if searchable else ""
    what = "; ".join(parts) or "no text"
    return (
        f"[At {time.strftime('%H:%M')}, {len(evicted)} messages were removed without a summary ({why}): "
        f"{what}.{find}]"
    )


def transcript(messages: list[dict[str, Any]]) -> list[str]:
    """The evicted messages as lines the summary request reads."""
    names: dict[str, str] = {}
    lines = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            lines.append(f"[{names.get(m.get('tool_call_id', ''), 'tool')} result] {content}")
        elif _images_message(m):
            count = sum(1 for p in content if p.get("type") == "image_url")
            lines.append(f"[{count} image(s) returned by the tools above]")
        else:
            if isinstance(content, str) and content.strip():
                lines.append(f"[{role}] {content}")
            for c in m.get("tool_calls") or []:
                fn = c.get("function", {})
                names[c.get("id", "")] = fn.get("name", "tool")
                lines.append(f"[{role} called {fn.get('name')}] {fn.get('arguments', '')}")
    return lines


def summary_request(
    lines: list[str], previous: str | None, window: ContextWindow, words: int
) -> list[dict[str, Any]]:
    """The chat messages that ask for a summary, clipped to fit :data:`SUMMARY_INPUT_SHARE` of the window."""
    system = SUMMARY_PROMPT.format(words=words)
    head = f"The earlier summary:\n<summary>\n{previous.strip() if previous else '(none)'}\n</summary>\n\n"
    head += "The messages to summarise, oldest first:\n<messages>\n"
    tail = "\n</messages>"
    budget = int(window.size * SUMMARY_INPUT_SHARE / window.scale) - text_tokens(system + head + tail) - 32
    per_line = _fair_share([text_tokens(line) for line in lines], max(budget, 0))
    clipped = [
        clip_to_tokens(line, cap, "[… {cut} characters left out …]")
        for line, cap in zip(lines, per_line, strict=True)
    ]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": head + "\n".join(clipped) + tail},
    ]


def _fair_share(sizes: list[int], budget: int) -> list[int]:
    """Caps so that ``sum(min(size, cap))`` fits ``budget``: small items whole, large ones cut alike."""
    if sum(sizes) <= budget:
        return sizes
    caps = [0] * len(sizes)
    left, order = budget, sorted(range(len(sizes)), key=lambda i: sizes[i])
    for rank, i in enumerate(order):
        share = left // (len(order) - rank)
        caps[i] = min(sizes[i], max(share, 24))
        left -= caps[i]
    return caps


def _size(
    messages: list[dict[str, Any]], summary: str | None, evicted: int, fixed: int, searchable: bool
) -> int:
    """Raw estimate of the request: what is fixed (system prompt, tools), the summary, the messages."""
    section = summary_section(summary, evicted, searchable)
    return fixed + (text_tokens(section) if section else 0) + sum(message_tokens(m) for m in messages)


async def compact(
    messages: list[dict[str, Any]],
    *,
    summary: str | None,
    evicted_before: int,
    window: ContextWindow,
    fixed: int,
    target: int,
    summarize: Summarize,
    searchable: bool,
    reason: str,
) -> Compacted:
    """Make ``messages`` (with ``summary`` and what is ``fixed``, raw tokens) fit ``target`` tokens."""
    messages = list(messages)
    before = window.tokens(_size(messages, summary, evicted_before, fixed, searchable))
    raw_target = int(target / window.scale)
    note = CUT_NOTE_SEARCHABLE if searchable else CUT_NOTE
    shortened: set[int] = set()
    evicted_total = evicted_before

    def size() -> int:
        return _size(messages, summary, evicted_total, fixed, searchable)

    # 1. old tool results, shortened
    cut_to = max(int(window.size * OLD_RESULT_SHARE / window.scale), MIN_RESULT_TOKENS)
    parts = groups(messages)
    for group in parts[:-1]:
        for i in group:
            m = messages[i]
            if m.get("role") == "tool" and isinstance(m.get("content"), str) and message_tokens(m) > cut_to:
                messages[i] = {**m, "content": clip_to_tokens(m["content"], cut_to, note)}
                shortened.add(id(messages[i]))

    # 2. the oldest groups, evicted and summarised
    evicted: list[dict[str, Any]] = []
    summarized, problem = False, ""
    if size() > raw_target:
        parts = groups(messages)
        pinned = _current_request(messages, parts, window)
        summary_room = int(window.size * SUMMARY_SHARE / window.scale)
        candidates = [g for g in parts[:-1] if g is not pinned]
        drop: list[list[int]] = []
        now = size() - (text_tokens(summary) if summary else 0) + summary_room
        for group in candidates:
            if now <= raw_target:
                break
            drop.append(group)
            now -= sum(message_tokens(messages[i]) for i in group)
        if drop:
            gone = {i for g in drop for i in g}
            evicted = [m for i, m in enumerate(messages) if i in gone]
            messages = [m for i, m in enumerate(messages) if i not in gone]
            evicted_total += len(evicted)
            words = max(60, int(summary_room * window.scale * 0.7))  # ≈ 0.75 words a token, with room
            summary, summarized, problem = await _new_summary(
                evicted, summary, window, words, summarize, searchable, summary_room
            )

    # 3. still too big: the remaining tool results share what is left
    if size() > raw_target:
        tools_at = [
            i for i, m in enumerate(messages) if m.get("role") == "tool" and isinstance(m.get("content"), str)
        ]
        rest = size() - sum(message_tokens(messages[i]) for i in tools_at)
        caps = _fair_share([message_tokens(messages[i]) for i in tools_at], max(raw_target - rest, 0))
        for i, cap in zip(tools_at, caps, strict=True):
            if message_tokens(messages[i]) > cap:
                messages[i] = {
                    **messages[i],
                    "content": clip_to_tokens(messages[i]["content"], max(cap, 40), note),
                }
                shortened.add(id(messages[i]))

    after = window.tokens(size())
    record = Compaction(
        evicted=len(evicted),
        shortened=sum(1 for m in messages if id(m) in shortened),
        summarized=summarized,
        before=before,
        after=after,
        window=window.size,
        reason=reason,
        note=problem,
    )
    window.compactions.append(record)
    return Compacted(messages, summary, evicted_total, record)


def _current_request(
    messages: list[dict[str, Any]], parts: list[list[int]], window: ContextWindow
) -> list[int] | None:
    """The group of the latest plain user message, when it is small enough to stay in view."""
    for group in reversed(parts):
        m = messages[group[0]]
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            if window.tokens(message_tokens(m)) <= window.size * PINNED_SHARE:
                return group
            return None
    return None


async def _new_summary(
    evicted: list[dict[str, Any]],
    previous: str | None,
    window: ContextWindow,
    words: int,
    summarize: Summarize,
    searchable: bool,
    room: int,
) -> tuple[str, bool, str]:
    """The summary that replaces ``evicted`` (the model's, or the previous one and a plain note)."""
    request = summary_request(transcript(evicted), previous, window, words)
    try:
        text = await summarize(request)
        problem = summary_problem(text)
    except Exception as exc:  # the endpoint failed, or answered with tool calls: fall back to a note
        log.warning("the summary request failed: %s", exc)
        text, problem = "", f"the summary request failed: {str(exc)[:200]}"
    if problem is None:
        return clip_to_tokens(text.strip(), room, "[… {cut} characters of the summary left out …]"), True, ""
    log.warning("compaction without a summary: %s", problem)
    note = dropped_note(evicted, problem, searchable)
    combined = f"{previous.strip()}\n{note}" if previous else note
    # the oldest part of a long run of notes goes first: the newest say what was dropped last
    if text_tokens(combined) > room:
        combined = clip_to_tokens(combined, room, "[… {cut} characters of older notes left out …]")
    return combined, False, problem

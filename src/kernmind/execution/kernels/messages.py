"""What a Jupyter kernel sends, read without trusting it: the fields a call uses, checked.

Design: session code holds the signing key and can send anything; ``message_parts`` returns the
type, parent id and content or what is wrong, ``fold_output`` reads a field of the wrong type
as missing, ``Ignored`` counts what was skipped.

Error policy: nothing here raises on content; ``MALFORMED`` lists what decoding a broken
message raises, for the loop to skip it.
"""

from __future__ import annotations

from typing import Any

from kernmind.execution.results import OutputCollector

# What a message the kernel's code forged or broke raises while it is decoded or read.
MALFORMED = (KeyError, ValueError, TypeError, AttributeError, IndexError, UnicodeError)


class Ignored:
    """Counts the malformed messages a loop skipped, keeping the first reason."""

    def __init__(self) -> None:
        self.count = 0
        self.why: str | None = None

    def add(self, why: str) -> None:
        self.count += 1
        self.why = self.why or why[:200]


def message_parts(msg: Any) -> tuple[str, str | None, dict[str, Any]] | str:
    """``(msg_type, parent msg_id, content)`` of a Jupyter message, or what is wrong with it.
    Code in a kernel can send anything on its sockets: nothing here trusts a field's type."""
    if not isinstance(msg, dict):
        return "not a JSON object"
    kind, parent, content = msg.get("msg_type"), msg.get("parent_header"), msg.get("content")
    if not isinstance(kind, str):
        return "no message type"
    if parent is None:
        parent = {}
    if not isinstance(parent, dict) or not isinstance(content, dict):
        return f"a {kind[:40]!r} message with a malformed header or content"
    parent_id = parent.get("msg_id")
    return kind, parent_id if isinstance(parent_id, str) else None, content


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def count_of(value: Any, count: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else count


def fold_output(msg: dict[str, Any], collector: OutputCollector, count: int | None) -> int | None:
    """Fold one iopub message (not ``status``) into ``collector``; returns the execution count, updated when
    the message carries one."""
    parts = message_parts(msg)
    if isinstance(parts, str):
        return count
    kind, _, content = parts
    if kind == "stream":
        name = content.get("name")
        collector.stream(name if name in ("stdout", "stderr") else "stdout", _text(content.get("text")))
    elif kind in ("execute_result", "display_data", "update_display_data"):
        data = content.get("data")
        if isinstance(data, dict):  # (a display without a MIME bundle shows nothing)
            collector.display(data, main=kind == "execute_result")
        if kind == "execute_result":
            count = count_of(content.get("execution_count"), count)
    elif kind == "error":
        tb = content.get("traceback")
        lines = [line for line in tb if isinstance(line, str)] if isinstance(tb, list) else []
        collector.set_error(
            _text(content.get("ename")) or "Error", _text(content.get("evalue")), "\n".join(lines)
        )
    elif kind == "execute_input":
        count = count_of(content.get("execution_count"), count)
    elif kind == "clear_output":
        collector.clear(wait=content.get("wait") is True)
    return count

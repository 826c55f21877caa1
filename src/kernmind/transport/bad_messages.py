"""What a message that MCP cannot serve is told, on either transport (HTTP or stdio).

Design: one place for the sentences, so both transports refuse the same mistakes in the same words;
``reply_id`` is the request's id when it can be written back, else null.
Error policy: nothing here raises for any input.
"""

from __future__ import annotations

import json
import re
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
_NOTHING_DONE = "Nothing was done."
_SEND = 'Send one JSON-RPC 2.0 object such as {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
# An id written right after the opening brace (as every MCP SDK writes requests) is the
# message's own: read it from the head of a message too large to parse.
_HEAD_ID = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")\s*[,}]'
)


def decode(body: bytes) -> tuple[Any, str | None]:
    """(the decoded message, None), or (None, why it is not one JSON value)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"it is not valid UTF-8 (byte {exc.start} cannot start or continue a character)"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "it is JSON nested too deeply to read"
    except ValueError as exc:  # JSONDecodeError, and integers past the digit limit
        shown = str(exc)
        return None, f"it is not valid JSON ({shown if len(shown) <= 120 else shown[:117] + '…'})"


def parse_sentence(why: str, *, per_line: bool = False) -> str:
    where = " per line" if per_line else ""
    return f"This message cannot be read: {why}. {_NOTHING_DONE} {_SEND}{where}, encoded as UTF-8."


def shape_problem(message: Any, each: str = "in its own POST") -> str | None:
    """Why this decoded message cannot be served as MCP: a batch, or an ``id`` that is not a
    string or an integer (None: nothing wrong seen here). ``each``: how requests go one by one."""
    if isinstance(message, list):
        return (
            "JSON-RPC batch requests are not supported: MCP removed batching in protocol version "
            f"2025-06-18. {_NOTHING_DONE} Send each request {each}."
        )
    if not isinstance(message, dict) or "id" not in message:
        return None
    rid = message["id"]
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        return None
    if isinstance(rid, float) and rid.is_integer():
        return None
    if rid is None and "method" not in message:
        return None  # an error response may carry a null id
    kind = {dict: "an object", list: "an array", bool: "a boolean", float: "a fraction"}.get(
        type(rid), "null"
    )
    shown = json.dumps(rid)
    shown = shown if len(shown) <= 60 else shown[:55] + "…"
    return (
        f'The JSON-RPC "id" must be a string or an integer; this request\'s id is {kind} ({shown}). '
        f'{_NOTHING_DONE} Send it again with an id such as 1 or "req-1".'
    )


def form_problem(message: Any, each: str = "in its own POST") -> str:
    """Why a decoded message is not a JSON-RPC 2.0 request, notification or response (for a
    message the SDK's model refused)."""
    shape = shape_problem(message, each)
    if shape is not None:
        return shape
    if not isinstance(message, dict):
        kind = {str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(message), "null"
        )
        why = f"it is {kind}, not an object"
    elif message.get("jsonrpc") != "2.0":
        why = 'its "jsonrpc" member must be the string "2.0"'
    elif "method" in message and not isinstance(message["method"], str):
        why = 'its "method" must be a string'
    elif "params" in message and not isinstance(message["params"], dict):
        why = 'its "params" must be an object'
    elif "method" not in message and "result" not in message and "error" not in message:
        why = 'it has no "method" (nor the "result" or "error" of a response)'
    else:
        why = "it is not a JSON-RPC 2.0 request, notification or response"
    return f"This message is not a JSON-RPC 2.0 message: {why}. {_NOTHING_DONE} {_SEND}."


def reply_id(message: Any) -> str | int | None:
    """The id an answer to ``message`` carries (see the module docstring)."""
    rid = message.get("id") if isinstance(message, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        return None
    if isinstance(rid, str):
        try:
            rid.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return rid


def head_id(head: bytes) -> str | int | None:
    """The id of a message from its first bytes, when it is written first (else None)."""
    match = _HEAD_ID.match(head)
    if match is None:
        return None
    raw = match.group(1)
    if raw.startswith(b'"'):
        try:
            return raw[1:-1].decode("utf-8")
        except UnicodeDecodeError:
            return None
    return int(raw)


def error_object(rid: str | int | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}

"""kernmind's memory tools, callable from the code you run (code mode).

    import kernmind_tools as km
    km.archival_memory_insert(content="churn is highest in March", tags=["finding"])
    hits = km.archival_memory_search(query="churn", top_k=5)["results"]
    km.call("memory_append", label="human", content="prefers short answers")

Each allowed tool is a function of this module with the tool's own arguments and description
(``help(km.archival_memory_search)``); ``call(name, **arguments)`` calls one by name. Results
are the tool's structured result as Python data (dicts, lists, strings, numbers). A refusal
(a bad argument, a version mismatch, a full block) raises ``ToolError`` with the sentence the
tool gives a client. Calls act as this session's principal, in its memory namespace, with the
same checks and limits as a call from the MCP client.

Only the memory tools are offered (the block tools, ``memory``, ``archival_memory_*`` and
``conversation_search``); ``tools()`` lists them.

This file runs inside the sandbox, on whatever Python runs the kernel: the standard library
only. It talks to the server over the session's own Unix socket (``KERNMIND_TOOLS_SOCKET``),
one JSON line per request and per answer, one connection per thread (reopened after a fork).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import threading
from typing import Any

__all__ = ["ToolError", "call", "tools"]

SOCKET_VARIABLE = "KERNMIND_TOOLS_SOCKET"
DEFAULT_SOCKET = "/run/kernmind/tools.sock"
_UNAVAILABLE = (
    "code mode is not available here: {why}. kernmind_tools works inside run_code's Python sessions "
    "on a kernmind server (not on a kernel gateway's kernels)."
)


class ToolError(Exception):
    """A tool refused the call; the message is the sentence the tool gives (what to do instead)."""


_local = threading.local()
_described: dict[str, Any] = {}


def _path() -> str:
    return os.environ.get(SOCKET_VARIABLE) or DEFAULT_SOCKET


def _connection() -> tuple[socket.socket, Any]:
    conn = getattr(_local, "conn", None)
    if conn is not None and _local.pid == os.getpid():
        return conn
    path = _path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ToolError(_UNAVAILABLE.format(why=f"cannot reach {path} ({exc.strerror or exc})")) from None
    conn = (sock, sock.makefile("rb"))
    _local.conn, _local.pid = conn, os.getpid()
    return conn


def _drop() -> None:
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        for part in (conn[1], conn[0]):
            try:
                part.close()
            except OSError:
                pass


def _plain(value: Any) -> Any:
    """numpy/pandas values (a row's int64, an array, a Timestamp) as the JSON data they stand for."""
    for method in ("tolist", "isoformat"):
        convert = getattr(value, method, None)
        if callable(convert):
            return convert()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"a {type(value).__name__} is not JSON data")


def _ask(request: dict[str, Any]) -> dict[str, Any]:
    try:
        # ASCII with escapes: a lone surrogate in a string still travels, and the tool decides.
        line = json.dumps(request, allow_nan=False, default=_plain).encode("ascii") + b"\n"
    except (TypeError, ValueError) as exc:
        raise ToolError(
            f"the arguments cannot be sent as JSON ({exc}); pass strings, numbers, lists and dicts."
        ) from None
    sock, reader = _connection()
    try:
        try:
            sock.sendall(line)
        except OSError:  # the server refused this connection: its sentence may be waiting
            pass
        answer = reader.readline()
    except OSError as exc:
        _drop()
        raise ToolError(f"code mode's connection broke ({exc}); try again.") from None
    except BaseException:  # an interrupt mid-call: the answer would arrive on the next call
        _drop()
        raise
    if not answer:
        _drop()
        raise ToolError("the server closed code mode's connection (the session is stopping); try again.")
    decoded = json.loads(answer)
    if decoded.get("closed"):  # refused for the whole connection: the next call opens a new one
        _drop()
    return decoded


def call(name: str, /, **arguments: Any) -> Any:
    """Call the memory tool ``name`` with ``arguments``; its structured result as Python data.
    Raises ``ToolError`` with the tool's sentence when it refuses."""
    answer = _ask({"op": "call", "tool": name, "arguments": arguments})
    if not answer.get("ok"):
        raise ToolError(answer.get("error") or "the tool failed")
    return answer.get("result")


def tools() -> list[str]:
    """The names of the tools this session's code may call."""
    return sorted(_describe())


def _describe() -> dict[str, Any]:
    if not _described:
        answer = _ask({"op": "describe"})
        if not answer.get("ok"):
            raise ToolError(answer.get("error") or "the server did not describe its tools")
        for spec in answer.get("tools", []):
            _described[spec["name"]] = spec
    return _described


class _Hint:
    """A type shown as written (``list[str]``), for signatures and ``help``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_JSON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "dict"}


def _annotation(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(repr(v) for v in prop["enum"])
    if "anyOf" in prop:
        return " | ".join(_annotation(p) for p in prop["anyOf"])
    kind = prop.get("type")
    if kind == "array":
        return f"list[{_annotation(prop.get('items', {}))}]"
    if kind == "null":
        return "None"
    return _JSON_TYPES.get(str(kind), "Any")


def _function(spec: dict[str, Any]) -> Any:
    name = spec["name"]
    schema = spec.get("input_schema") or {}
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    params = []
    for arg in sorted(props, key=lambda a: a not in required):  # required ones first, in schema order
        prop = props[arg]
        default = inspect.Parameter.empty if arg in required else prop.get("default")
        params.append(
            inspect.Parameter(
                arg,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=_Hint(_annotation(prop)),
            )
        )
    signature = inspect.Signature(params, return_annotation=_Hint("dict"))
    order = [p.name for p in params]

    def tool(*args: Any, **arguments: Any) -> Any:
        if len(args) > len(order):
            raise ToolError(
                f"{name} takes at most {len(order)} positional arguments ({', '.join(order)}), got {len(args)}."
            )
        for arg, value in zip(order, args):  # noqa: B905 (the kernel may run a Python before 3.10)
            if arg in arguments:
                raise ToolError(f"{name} got '{arg}' twice (by position and by name).")
            arguments[arg] = value
        return call(name, **arguments)  # unknown names go on: the tool's sentence names the valid ones

    lines = [spec.get("description") or name, ""]
    if props:
        lines.append("Arguments:")
        for param in params:
            prop = props[param.name]
            mark = " (required)" if param.name in required else f" (default {param.default!r})"
            lines.append(
                f"    {param.name}: {param.annotation}{mark} — {prop.get('description', '')}".rstrip(" —")
            )
    lines += ["", "Returns the tool's structured result; raises ToolError when the tool refuses."]
    tool.__name__ = tool.__qualname__ = name
    tool.__module__ = __name__
    tool.__doc__ = "\n".join(lines)
    tool.__signature__ = signature  # type: ignore[attr-defined]
    return tool


def _install() -> None:
    """Make one function per allowed tool (at import; when the server cannot be reached then,
    ``call`` still works later and the functions appear on first use)."""
    for spec in _describe().values():
        name = spec["name"]
        globals()[name] = _function(spec)
        if name not in __all__:
            __all__.append(name)


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    if not _described:
        try:
            _install()
        except ToolError as exc:
            raise AttributeError(f"module 'kernmind_tools' has no attribute {name!r}: {exc}") from None
    if name in globals():
        return globals()[name]
    raise AttributeError(
        f"module 'kernmind_tools' has no attribute {name!r}; its tools: {', '.join(sorted(_described))}"
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_described))


try:
    _install()
except (ToolError, OSError, ValueError):
    pass  # not in a kernmind session (or not yet reachable): call() says why when used

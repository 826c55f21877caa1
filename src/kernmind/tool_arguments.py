"""Strict arguments for every tool of a server, checked in one place (so no new tool can forget them).

Design: ``strict_tool_arguments(server)`` wraps ``tools/list`` (``additionalProperties: false``,
output schemas inlined) and ``tools/call`` (the tool's model made strict); the SDK gets the checked
arguments, so a call is validated once. Error policy: a refusal is an ``isError`` result, one
sentence per problem; the tool does not run.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, ValidationError

from kernmind.sdk_compat import lowlevel_server, registered_tool, validate_arguments_with
from kernmind.validation_text import location, problem, shown


def strict_tool_arguments(server: MCPServer) -> None:
    """Make every tool of ``server`` refuse unknown arguments and non-finite numbers, in words."""
    low = lowlevel_server(server)
    call_entry = low.get_request_handler("tools/call")
    list_entry = low.get_request_handler("tools/list")
    if call_entry is None or list_entry is None:
        raise RuntimeError("strict_tool_arguments needs a server with tools/call and tools/list handlers")

    async def call_tool(ctx: Any, params: Any) -> Any:
        refusal = check_arguments(server, params.name, params.arguments or {})
        if refusal is not None:
            return CallToolResult(content=[TextContent(type="text", text=refusal)], is_error=True)
        return await call_entry.handler(ctx, params)

    async def list_tools(ctx: Any, params: Any) -> Any:
        result = await list_entry.handler(ctx, params)
        for tool in result.tools:
            if tool.input_schema.get("type") == "object":
                tool.input_schema = {**tool.input_schema, "additionalProperties": False}
            if tool.output_schema is not None and "$defs" in tool.output_schema:
                tool.output_schema = inline_definitions(tool.output_schema)
        return result

    low.add_request_handler("tools/call", call_entry.params_type, call_tool)
    low.add_request_handler("tools/list", list_entry.params_type, list_tools)


# The arguments this request's check accepted, and what they validated to (for the SDK's turn).
_CHECKED: ContextVar[tuple[dict[str, Any], dict[str, Any]] | None] = ContextVar("checked", default=None)
_HOOKED = "_kernmind_validated_once"


def _validated_once(arguments: dict[str, Any], original: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """The SDK's validation of a tool's arguments: the check's result when it checked these."""
    checked = _CHECKED.get()
    if checked is not None and checked[0] is arguments:
        _CHECKED.set(None)
        return dict(checked[1])
    return original(arguments)


def inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each local ``{"$ref": "#/$defs/X"}`` replaced by definition X (keywords
    beside the reference kept) and no ``$defs``; unchanged when a definition refers to itself,
    directly or not, or a reference is not to a local definition."""
    definitions = schema["$defs"]

    class Unsupported(Exception):
        pass

    def expand(node: Any, within: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [expand(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: expand(value, within) for key, value in node.items() if key not in ("$ref", "$defs")}
        ref = node.get("$ref")
        if ref is None:
            return out
        name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else None
        if name is None or name == ref or name not in definitions or name in within:
            raise Unsupported
        return {**expand(definitions[name], (*within, name)), **out}

    try:
        return expand(schema, ())
    except Unsupported:
        return schema


def check_arguments(server: MCPServer, name: str, arguments: dict[str, Any]) -> str | None:
    """Why these arguments are refused for tool ``name`` (None: fine, or not a tool we know)."""
    _CHECKED.set(None)
    tool = registered_tool(server, name)
    if tool is None:
        return None  # the SDK answers "Unknown tool"
    metadata = tool.fn_metadata
    if not getattr(tool, _HOOKED, False):
        validate_arguments_with(tool, _validated_once)
        object.__setattr__(tool, _HOOKED, True)
    valid = list(tool.parameters.get("properties", {}))
    problems: dict[str, str] = {}  # by argument path: one sentence each
    fields = metadata.arg_model.model_fields
    for arg, value in arguments.items():  # first: a wrong type explains a bound's complaint too
        field = fields.get(arg)
        if field is not None:
            for path, why in _loose_scalars(field.annotation, value, (arg,)):
                problems.setdefault(path, f"'{path}' {why}")
    validated = None
    try:
        validated = _strict(metadata.arg_model).model_validate(metadata.pre_parse_json(arguments))
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.setdefault(location(err["loc"]), _sentence(err, valid))
    for path, value in _leaves(arguments):
        if (why := _unreadable(value)) is not None:
            problems.setdefault(path, f"'{path}' {why}")
    if not problems:
        if validated is not None:
            _CHECKED.set((arguments, validated.model_dump_one_level()))
        return None
    return (
        f"Invalid arguments for {name}: "
        + "; ".join(problems.values())
        + f". Valid arguments: {describe_arguments(tool.parameters)}."
    )


def describe_arguments(schema: dict[str, Any]) -> str:
    """``code (string, required), language ('python' or 'bash'), …`` from a JSON schema."""
    required = set(schema.get("required", ()))
    parts = []
    for arg, prop in schema.get("properties", {}).items():
        kind = _kind(prop)
        if arg in required:
            kind = f"{kind}, required" if kind else "required"
        parts.append(f"{arg} ({kind})" if kind else arg)
    return ", ".join(parts) or "none (call it with {})"


def _kind(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        values = [shown(v) for v in prop["enum"]]
        return " or ".join(values) if len(values) < 3 else "one of " + ", ".join(values)
    if "anyOf" in prop:
        kinds = [_kind(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(k for k in kinds if k)
    return str(prop.get("type", ""))


def _sentence(error: Any, valid: list[str]) -> str:
    where = location(error["loc"])
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        close = difflib.get_close_matches(str(error["loc"][0]), valid, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"'{where}' is not an argument of this tool{hint}"
    return f"'{where}' {problem(error)}"


def _leaves(value: Any, path: tuple[int | str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Every scalar in the arguments with where it is (``tags[1]``), also inside values typed Any."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield location(path), value


def _unreadable(value: Any) -> str | None:
    """Why a scalar no tool can use is refused: a raw NaN or infinity (JSON literals the SDK's
    parser accepts), or text holding half of a UTF-16 surrogate pair (JSON lets ``"\\ud800"``
    through; UTF-8, so a store or a kernel, cannot encode it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number (not NaN or infinity), got {value}"
    if isinstance(value, str) and not value.isascii() and not _encodes(value):
        for index, char in enumerate(value):
            if 0xD800 <= ord(char) <= 0xDFFF:
                return (
                    f"holds a lone surrogate (\\u{ord(char):04x} at character {index}), which is not "
                    "text UTF-8 can encode: remove it, or send the character it was half of"
                )
    return None


def _encodes(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 material (no lone surrogate): one C-speed pass, where a
    look at each character costs a Python loop over a whole code cell on every call."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _loose_scalars(annotation: Any, value: Any, path: tuple[int | str, ...]) -> Iterator[tuple[str, str]]:
    """Numbers and booleans given as something else (a string, a boolean for a number, a number
    for a boolean), which pydantic's lax mode would convert."""
    if value is None:
        return
    origin = get_origin(annotation)
    if origin is Annotated:
        yield from _loose_scalars(get_args(annotation)[0], value, path)
        return
    if origin in (Union, UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            yield from _loose_scalars(options[0], value, path)
        return
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        for index, element in enumerate(value):
            yield from _loose_scalars(item, element, (*path, index))
        return
    kind = {bool: "bool_type", int: "int_type", float: "float_type"}.get(annotation)
    if kind is None:
        return
    ok = (
        isinstance(value, bool)
        if annotation is bool
        else isinstance(value, int | float) and not isinstance(value, bool)
    )
    if not ok and not _non_finite_text(value):  # ("NaN" gets the finite-number sentence)
        yield location(path), problem({"type": kind, "loc": path, "msg": "", "input": value})  # type: ignore[typeddict-item]


def _non_finite_text(value: Any) -> bool:
    try:
        return isinstance(value, str) and not math.isfinite(float(value))
    except ValueError:
        return False


@cache
def _strict(model: type[BaseModel]) -> type[BaseModel]:
    """The tool's argument model, refusing unknown names and non-finite numbers."""
    return type(
        model.__name__,
        (model,),
        {"model_config": ConfigDict(extra="forbid", allow_inf_nan=False), "__module__": __name__},
    )

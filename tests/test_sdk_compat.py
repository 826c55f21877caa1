"""The private ``mcp`` SDK attributes kernmind relies on still exist and mean what we think.

If one of these fails after an SDK upgrade, the message names the attribute: fix
``kernmind/sdk_compat.py`` (and only it) before anything else.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Any

import mcp
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer

from kernmind import sdk_compat
from kernmind.sdk_compat import (
    SDKIncompatible,
    lowlevel_server,
    registered_tool,
    route_calls_through,
    session_connection,
)

SRC = pathlib.Path(sdk_compat.__file__).parent

pytestmark = pytest.mark.anyio


def _server() -> tuple[MCPServer, list[Any]]:
    server = MCPServer("compat")
    seen: list[Any] = []

    @server.tool()
    async def where(ctx: Context, n: int = 1) -> int:
        seen.append(session_connection(ctx.session))
        return n

    return server, seen


def test_lowlevel_server_has_what_serving_and_handlers_use() -> None:
    server, _ = _server()
    low = lowlevel_server(server)
    for public in ("run", "create_initialization_options", "get_request_handler", "add_request_handler"):
        assert callable(getattr(low, public, None)), f"low-level Server lost {public!r}"
    assert low.get_request_handler("tools/call") is not None


def test_registered_tool_exposes_its_argument_model() -> None:
    server, _ = _server()
    tool = registered_tool(server, "where")
    assert tool is not None and registered_tool(server, "nope") is None
    metadata = tool.fn_metadata
    assert set(metadata.arg_model.model_fields) == {"n"}
    assert metadata.pre_parse_json({"n": "[1]"}) == {"n": [1]}


async def test_session_connection_is_one_object_per_handshake_client() -> None:
    server, seen = _server()
    async with Client(server, mode="legacy") as first:
        await first.call_tool("where", {})
        await first.call_tool("where", {})
        async with Client(server, mode="legacy") as second:
            await second.call_tool("where", {})
    assert seen[0] is seen[1], "the connection behind ctx.session must outlive one request"
    assert seen[0] is not seen[2], "two clients must have two connections"
    assert seen[0] is not None


def test_a_missing_attribute_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Bare:
        pass

    with pytest.raises(
        SDKIncompatible, match=r"Bare has no attribute '_lowlevel_server'.*kernmind/sdk_compat.py"
    ):
        lowlevel_server(Bare())  # type: ignore[arg-type]
    with pytest.raises(SDKIncompatible, match=r"'_tool_manager'"):
        registered_tool(Bare(), "x")  # type: ignore[arg-type]
    with pytest.raises(SDKIncompatible, match=r"'_connection'"):
        session_connection(Bare())
    with pytest.raises(SDKIncompatible, match=r"'_handle_call_tool'"):
        route_calls_through(Bare(), call_tool=None, read_resource=None)  # type: ignore[arg-type]


async def test_tool_calls_and_resource_reads_go_through_the_routed_methods() -> None:
    server, _ = _server()

    @server.resource("compat://thing")
    async def thing() -> str:
        return "the thing"

    seen: list[str] = []
    call, read = server.call_tool, server.read_resource

    async def call_tool(name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        seen.append(f"call {name}")
        return await call(name, arguments, context)

    async def read_resource(uri: Any, context: Any = None) -> Any:
        seen.append(f"read {uri}")
        return await read(uri, context)

    route_calls_through(server, call_tool=call_tool, read_resource=read_resource)
    async with Client(server) as client:
        assert (await client.call_tool("where", {"n": 2})).structured_content == {"result": 2}
        assert (await client.read_resource("compat://thing")).contents[0].text == "the thing"  # type: ignore[union-attr]
    assert seen == ["call where", "read compat://thing"]


def _sdk_private_names() -> set[str]:
    """Every ``self._x`` attribute the installed SDK assigns."""
    names: set[str] = set()
    for path in pathlib.Path(mcp.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return names


def test_no_other_module_touches_private_sdk_attributes() -> None:
    private = _sdk_private_names()
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "sdk_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            attr = None
            if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                attr = node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
            ):
                attr = node.args[1].value
            if attr in private:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} .{attr}")
    assert not offenders, "use kernmind.sdk_compat instead of private SDK attributes: " + ", ".join(offenders)


def test_validate_arguments_with_takes_the_sdks_validation_of_one_tool() -> None:
    server, _ = _server()
    tool = registered_tool(server, "where")
    assert tool is not None
    seen: list[dict[str, Any]] = []

    def validate(arguments: dict[str, Any], original: Any) -> dict[str, Any]:
        seen.append(arguments)
        return original(arguments)

    sdk_compat.validate_arguments_with(tool, validate)
    assert tool.fn_metadata.validate_arguments({"n": "3"}) == {"n": 3}  # the SDK's own, through ours
    assert seen == [{"n": "3"}]


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_console_script_keeps_jsonschema_from_compiling_the_iri_grammar() -> None:
    """rfc3987_syntax compiles an Earley grammar when jsonschema imports it (seconds, at a client's
    first tool call or a first notebook export): ``kernmind`` blocks it first thing, whatever the
    subcommand, and jsonschema still checks a result against its schema."""
    blocked = _python(
        "import sys\n"
        "from kernmind.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "import jsonschema\n"
        "schema = {'type': 'object', 'properties': {'n': {'type': 'integer'}}, 'required': ['n']}\n"
        "v = jsonschema.validators.validator_for(schema)(schema)\n"
        "print(sys.modules['rfc3987_syntax'], 'iri' in jsonschema.FormatChecker.checkers,"
        " v.is_valid({'n': 1}), v.is_valid({'n': 'x'}))\n"
    )
    assert blocked.splitlines()[-1] == "None False True False", blocked

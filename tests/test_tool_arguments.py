"""Every tool refuses arguments it does not know and numbers that are not finite, in words.

The rules are checked for the whole family — every tool the server lists and every
numeric argument each one takes, so tools added later are covered without touching this
file — over a real MCP client (in-process), and the wire cases (a raw ``NaN`` literal)
over real stdio and HTTP servers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from pydantic import AfterValidator

from kernmind.sdk_compat import registered_tool
from kernmind.server import create_server
from kernmind.tool_arguments import strict_tool_arguments
from tests.conftest import error_text, make_settings, structured
from tests.transport.procs import HttpServer, StdioServer, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RAW_PYDANTIC = ("validation error", "errors.pydantic.dev", "Arguments\n", "type=", "input_value")
NON_FINITE_STRINGS = ["NaN", "nan", "inf", "-Infinity", " Infinity "]


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    data = tmp_path_factory.mktemp("strict")
    async with Client(create_server(make_settings(data, pool_size=0, sandbox="none"))) as c:
        yield c


@pytest.fixture(scope="module")
async def tools(client: Client) -> dict[str, dict[str, Any]]:
    return {t.name: t.input_schema for t in (await client.list_tools()).tools}


def plausible(schema: dict[str, Any]) -> Any:
    """A value of the schema's type (the call is refused before the tool runs anyway)."""
    if "enum" in schema:
        return schema["enum"][0]
    kinds = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
    for kind, value in [("string", "x"), ("integer", 1), ("number", 1.5), ("boolean", False)]:
        if kind in kinds:
            return value
    return [] if "array" in kinds else {}


def required_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    return {name: plausible(props[name]) for name in schema.get("required", [])}


def numeric_arguments(schema: dict[str, Any]) -> list[str]:
    out = []
    for name, prop in schema.get("properties", {}).items():
        kinds = {prop.get("type")} | {s.get("type") for s in prop.get("anyOf", [])}
        if kinds & {"number", "integer"}:
            out.append(name)
    return out


def assert_sentence(text: str, tool: str) -> None:
    assert text.startswith(f"Invalid arguments for {tool}: "), text
    assert "Valid arguments: " in text, text
    for raw in RAW_PYDANTIC:
        assert raw not in text, f"raw pydantic output in {text!r}"


# --- schemas --------------------------------------------------------------------------------
async def test_every_input_schema_says_no_additional_properties(tools: dict[str, dict[str, Any]]) -> None:
    assert len(tools) >= 15
    for name, schema in tools.items():
        assert schema.get("type") == "object", name
        assert schema.get("additionalProperties") is False, name


# --- unknown arguments ----------------------------------------------------------------------
async def test_every_tool_refuses_an_unknown_argument_and_lists_the_valid_ones(
    client: Client, tools: dict[str, dict[str, Any]]
) -> None:
    for name, schema in tools.items():
        result = await client.call_tool(name, {**required_arguments(schema), "zz_unknown": 1})
        text = error_text(result)
        assert_sentence(text, name)
        assert "'zz_unknown' is not an argument of this tool" in text, text
        for arg in schema.get("properties", {}):
            assert arg in text.split("Valid arguments: ", 1)[1], (name, arg, text)


async def test_a_misspelt_session_id_is_refused_and_the_code_does_not_run(client: Client) -> None:
    result = await client.call_tool("run_code", {"code": "open('ran.txt', 'w').close()", "sesion_id": "typo"})
    text = error_text(result)
    assert "'sesion_id' is not an argument of this tool (did you mean 'session_id'?)" in text
    assert "session_id (string)" in text and "code (string, required)" in text
    check = structured(await client.call_tool("run_code", {"code": "import os; os.path.exists('ran.txt')"}))
    assert check["results"][0]["text"] == "False"


async def test_a_misspelt_memory_argument_changes_nothing(client: Client) -> None:
    structured(await client.call_tool("memory_create", {"label": "strict", "value": "one"}))
    text = error_text(await client.call_tool("memory_append", {"label": "strict", "contents": "two"}))
    assert "did you mean 'content'?" in text
    block = structured(await client.call_tool("memory_read", {"label": "strict"}))
    assert block["value"] == "one"


async def test_text_with_a_lone_surrogate_is_refused_in_words_and_nothing_is_stored(client: Client) -> None:
    """JSON lets half of a UTF-16 pair through; UTF-8 (a store, a kernel) cannot hold it."""
    text = error_text(await client.call_tool("archival_memory_insert", {"content": "half: \ud800 and café"}))
    assert "'content' holds a lone surrogate (\\ud800 at character 6)" in text, text
    text = error_text(
        await client.call_tool("archival_memory_insert", {"content": "x", "tags": ["a", "\udcff"]})
    )
    assert "'tags[1]' holds a lone surrogate" in text, text
    found = structured(await client.call_tool("archival_memory_search", {"query": "half"}))
    assert found["results"] == [], found
    text = error_text(await client.call_tool("run_code", {"code": "x = '\ud800'"}))
    assert "'code' holds a lone surrogate" in text, text


# --- numbers ----------------------------------------------------------------------------------
async def test_every_numeric_argument_refuses_non_finite_values(
    client: Client, tools: dict[str, dict[str, Any]]
) -> None:
    checked = 0
    for name, schema in tools.items():
        for arg in numeric_arguments(schema):
            for bad in NON_FINITE_STRINGS:
                result = await client.call_tool(name, {**required_arguments(schema), arg: bad})
                text = error_text(result)
                assert_sentence(text, name)
                assert f"'{arg}' must be" in text and repr(bad) in text, text
                checked += 1
    assert checked >= 5 * len(NON_FINITE_STRINGS)  # timeout, limit, top_k, id, page, …


async def test_a_nan_timeout_does_not_lift_the_time_limit(client: Client) -> None:
    # Refused, not run: run, the code would sleep 600 s; the 120 s bound only catches that, never a slow machine.
    with anyio.fail_after(120):
        result = await client.call_tool(
            "run_code", {"code": "import time; time.sleep(600)", "timeout": "NaN"}
        )
    assert "'timeout' must be a finite number (not NaN or infinity), got 'NaN'" in error_text(result)


def scalar_arguments(schema: dict[str, Any]) -> dict[str, str]:
    """Every number/integer/boolean argument of a schema, with its JSON type."""
    out = {}
    for name, prop in schema.get("properties", {}).items():
        kinds = {prop.get("type")} | {s.get("type") for s in prop.get("anyOf", [])}
        for kind in ("boolean", "integer", "number"):
            if kind in kinds:
                out[name] = kind
    return out


async def test_every_number_and_boolean_argument_refuses_strings_and_the_other_type(
    client: Client, tools: dict[str, dict[str, Any]]
) -> None:
    """pydantic's lax mode read "60" as 60, true as 1 and "yes" as true: every tool refuses them."""
    wrong = {
        "number": ["60", "1", True, False],
        "integer": ["5", "0", True],
        "boolean": ["true", "yes", 1, 0],
    }
    expected = {
        "number": "must be a number",
        "integer": "must be an integer",
        "boolean": "must be true or false",
    }
    checked = set()
    for name, schema in tools.items():
        for arg, kind in scalar_arguments(schema).items():
            for bad in wrong[kind]:
                result = await client.call_tool(name, {**required_arguments(schema), arg: bad})
                text = error_text(result)
                assert_sentence(text, name)
                assert f"'{arg}' {expected[kind]}, got {bad!r}" in text, (name, arg, text)
            checked.add((name, arg))
    assert {("run_code", "timeout"), ("run_code", "reset"), ("run_code", "background")} <= checked
    assert len(checked) >= 10


async def test_a_string_timeout_is_refused_and_the_code_does_not_run(client: Client) -> None:
    for bad in ("60", True):
        text = error_text(
            await client.call_tool("run_code", {"code": "open('t.txt', 'w').close()", "timeout": bad})
        )
        assert f"'timeout' must be a number, got {bad!r}" in text
    check = structured(await client.call_tool("run_code", {"code": "import os; os.path.exists('t.txt')"}))
    assert check["results"][0]["text"] == "False"


async def test_numbers_of_the_right_type_still_pass(client: Client) -> None:
    # an integer where a number is expected, and a list sent as a JSON string (some clients do)
    out = structured(await client.call_tool("run_code", {"code": "6 * 7", "timeout": 30, "reset": False}))
    assert out["results"][0]["text"] == "42"
    text = error_text(
        await client.call_tool("memory", {"command": "view", "path": "/memories", "view_range": ["1", 2]})
    )
    assert "'view_range[0]' must be an integer, got '1'" in text
    structured(await client.call_tool("archival_memory_insert", {"content": "typed", "tags": '["a", "b"]'}))


# --- other validation errors read as sentences -----------------------------------------------
@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("run_code", {}, "'code' is required"),
        ("run_code", {"code": 5}, "'code' must be a string, got 5"),
        ("run_code", {"code": "1", "reset": "maybe"}, "'reset' must be true or false, got 'maybe'"),
        ("run_code", {"code": "1", "timeout": "soon"}, "'timeout' must be a number, got 'soon'"),
        (
            "memory_history",
            {"label": "x", "limit": 1000},
            "'limit' must be less than or equal to 500, got 1000",
        ),
        ("memory_create", {"label": "x", "limit": 1.5}, "'limit' must be a whole number, got 1.5"),
        ("archival_memory_insert", {"content": "x", "tags": "ops"}, "'tags' must be a list, got 'ops'"),
        ("archival_memory_insert", {"content": "x", "tags": ["a", 3]}, "'tags[1]' must be a string, got 3"),
    ],
)
async def test_validation_errors_are_sentences(
    client: Client, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    text = error_text(await client.call_tool(tool, arguments))
    assert_sentence(text, tool)
    assert expected in text, text


async def test_a_long_input_is_not_echoed_back(client: Client) -> None:
    text = error_text(await client.call_tool("run_code", {"code": "x" * 100_000, "reset": "x" * 100_000}))
    assert len(text) < 1000, len(text)


# --- the mechanism covers tools registered after it ------------------------------------------
async def test_a_tool_registered_later_is_strict_too() -> None:
    server = MCPServer("later")
    strict_tool_arguments(server)

    @server.tool()
    async def scale(factor: float, options: dict[str, Any] | None = None) -> float:
        return factor * 2

    async with Client(server) as c:
        schema = {t.name: t.input_schema for t in (await c.list_tools()).tools}["scale"]
        assert schema["additionalProperties"] is False
        assert not (await c.call_tool("scale", {"factor": 2})).is_error
        assert "'fatcor' is not an argument" in error_text(await c.call_tool("scale", {"fatcor": 2}))
        assert "'factor' must be a finite number" in error_text(await c.call_tool("scale", {"factor": "inf"}))


# --- raw NaN literals on the wire ---------------------------------------------------------------
NAN_CALL = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"import time; time.sleep(600)","timeout":%s}%s}}'
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
}


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = start_http(tmp_path_factory.mktemp("strict-http"), "--sandbox", "none")
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log_text()


def _answer(response: httpx2.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


@pytest.mark.xdist_group("transport")
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_a_raw_non_finite_literal_over_http_is_refused(http_server: HttpServer, literal: str) -> None:
    body = NAN_CALL % (literal, ',"_meta":' + json.dumps(MODERN_META))
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "run_code",
    }
    # Run, the code would sleep 600 s: the client's 120 s timeout catches that, never a slow machine.
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(http_server.url, content=body, headers=headers)
    assert response.status_code == 200, response.text
    result = _answer(response)["result"]
    assert result["isError"] is True
    assert "'timeout' must be a finite number (not NaN or infinity)" in result["content"][0]["text"]


@pytest.mark.xdist_group("transport")
def test_a_raw_nan_literal_over_stdio_is_refused(tmp_path: Path) -> None:
    server = StdioServer.start(tmp_path, "--sandbox", "none")
    try:
        result = server.request(
            "tools/call",
            {
                "name": "run_code",
                "arguments": {"code": "import time; time.sleep(20)", "timeout": float("nan")},
            },
        )  # json.dumps writes the bare NaN literal
        assert result["isError"] is True
        assert (
            "'timeout' must be a finite number (not NaN or infinity), got nan" in result["content"][0]["text"]
        )
        ok = server.call_tool("memory_list", {})  # the server keeps serving
        assert ok["structuredContent"]["blocks"]
    finally:
        server.close_stdin()
        assert server.wait() == 0


VALIDATIONS: list[str] = []


def _counted(value: str) -> str:
    VALIDATIONS.append(value)
    return value.upper()


Counted = Annotated[str, AfterValidator(_counted)]


async def test_a_calls_arguments_are_validated_once_and_the_tool_gets_what_the_check_accepted() -> None:
    """The strict check's validated arguments stand in for the SDK's second validation of the same
    call (``sdk_compat.validate_arguments_with``); a call the check never saw is validated as before."""
    validations = VALIDATIONS
    validations.clear()
    server = MCPServer("once")

    @server.tool()
    async def shout(text: Counted, times: int = 1) -> str:
        return text * times

    strict_tool_arguments(server)
    async with Client(server) as c:
        assert structured(await c.call_tool("shout", {"text": "ab", "times": 2}))["result"] == "ABAB"
        assert validations == ["ab"]
        assert "'times' must be an integer" in error_text(
            await c.call_tool("shout", {"text": "c", "times": "2"})
        )
        assert validations == ["ab", "c"]  # refused by the check: the tool never ran
    tool = registered_tool(server, "shout")
    assert tool is not None
    # Arguments that did not come through the check: the SDK's own validation, as before.
    assert tool.fn_metadata.validate_arguments({"text": "d"}) == {"text": "D", "times": 1}
    assert validations == ["ab", "c", "d"]


async def test_text_of_a_whole_code_cell_is_checked_for_lone_surrogates_too(client: Client) -> None:
    cell = "x = 'é'\n" * 5000 + "y = '\ud83d'"
    text = error_text(await client.call_tool("run_code", {"code": cell}))
    assert f"'code' holds a lone surrogate (\\ud83d at character {len(cell) - 2})" in text, text


async def test_output_schemas_are_published_without_references(client: Client) -> None:
    """A client validating every result resolves no ``$ref`` per result; the schema means the same."""
    listed = {t.name: t.output_schema for t in (await client.list_tools()).tools}
    assert listed["run_code"] is not None and "$ref" not in json.dumps(listed["run_code"])
    image = listed["run_code"]["properties"]["results"]["items"]["properties"]["image"]
    assert {"type": "null"} in image["anyOf"] and any(
        option.get("required") == ["content_index", "mime_type", "bytes"] for option in image["anyOf"]
    )
    assert not [name for name, schema in listed.items() if schema and "$ref" in json.dumps(schema)]


def test_a_schema_that_refers_to_itself_is_published_as_it_is() -> None:
    from kernmind.tool_arguments import inline_definitions

    nested = {"$defs": {"B": {"type": "integer"}}, "properties": {"b": {"$ref": "#/$defs/B", "title": "b"}}}
    assert inline_definitions(nested) == {"properties": {"b": {"type": "integer", "title": "b"}}}
    recursive = {"$defs": {"N": {"properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"}
    assert inline_definitions(recursive) is recursive

"""Small pure parts: streamed tool-call stitching, argument parsing, result conversion, mcp.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import mcp_types as types
import pytest

from kernmind.agent.config import ConfigError, load_mcp_config
from kernmind.agent.model import _merge_call_delta, parse_arguments
from kernmind.agent.results import convert_result


def delta(index: int | None, id: str | None = None, name: str | None = None, args: str | None = None) -> NS:
    return NS(index=index, id=id, function=NS(name=name, arguments=args))


def stitch(deltas: list[list[NS]]) -> list[dict]:
    calls: dict[int, dict] = {}
    for chunk in deltas:
        for pos, d in enumerate(chunk):
            _merge_call_delta(calls, d, pos)
    return [calls[k] for k in sorted(calls)]


def test_fragments_by_index_are_stitched() -> None:
    out = stitch(
        [
            [delta(0, "a", "add", "")],
            [delta(0, None, None, '{"a": ')],
            [delta(1, "b", "echo", '{"text"')],
            [delta(0, None, None, "1}")],
            [delta(1, None, None, ': "x"}')],
        ]
    )
    assert out == [
        {"id": "a", "name": "add", "arguments": '{"a": 1}'},
        {"id": "b", "name": "echo", "arguments": '{"text": "x"}'},
    ]


def test_whole_calls_without_index_or_with_a_reused_index() -> None:
    # Ollama-style: every call complete in one delta; some servers send index None or always 0.
    assert [c["id"] for c in stitch([[delta(None, "a", "add", "{}"), delta(None, "b", "echo", "{}")]])] == [
        "a",
        "b",
    ]
    out = stitch([[delta(0, "a", "add", "{}")], [delta(0, "b", "echo", '{"text": "y"}')]])
    assert [(c["id"], c["name"], c["arguments"]) for c in out] == [
        ("a", "add", "{}"),
        ("b", "echo", '{"text": "y"}'),
    ]


def test_parse_arguments() -> None:
    assert parse_arguments('{"a": 1}') == ({"a": 1}, None)
    assert parse_arguments("  ") == ({}, None)
    assert parse_arguments("{")[0] is None
    assert "not valid JSON" in (parse_arguments("{")[1] or "")
    assert "JSON object" in (parse_arguments("3")[1] or "")


def test_convert_result_text_structured_images_and_truncation() -> None:
    r = types.CallToolResult(content=[], structured_content={"status": "ok"})
    assert convert_result(r, max_chars=100).text == '{"status": "ok"}'
    r = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="x" * 500),
            types.ImageContent(type="image", data="QUJD", mime_type="image/png"),
        ],
    )
    out = convert_result(r, max_chars=120)
    assert len(out.text) < 200 and "characters cut" in out.text
    assert out.images == ["data:image/png;base64,QUJD"]
    err = convert_result(
        types.CallToolResult(content=[types.TextContent(type="text", text="bad")], is_error=True),
        max_chars=100,
    )
    assert err.is_error and err.text == "Error: bad"


def test_load_mcp_config(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "a": {"command": "python", "args": ["-m", "x"], "env": {"K": "v"}},
                    "b": {"url": "http://127.0.0.1:1/mcp"},
                    "c": {"command": "off", "disabled": True},
                }
            }
        )
    )
    specs = load_mcp_config(path)
    assert [s.name for s in specs] == ["a", "b"]
    assert specs[0].target.args == ["-m", "x"] and specs[0].target.env == {"K": "v"}
    assert specs[1].target == "http://127.0.0.1:1/mcp"
    for bad in (
        "[]",
        '{"mcpServers": {"x": {}}}',
        '{"mcpServers": {"x": {"command": "p", "args": "no"}}}',
        "{",
    ):
        path.write_text(bad)
        with pytest.raises(ConfigError):
            load_mcp_config(path)

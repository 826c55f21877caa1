"""``mcp.json.example`` stays valid: every client section parses and points at what the server serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernmind.cli import build_parser

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.fast]

EXAMPLE = Path(__file__).resolve().parents[2] / "mcp.json.example"


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def test_stdio_entries_are_valid_serve_command_lines(example: dict[str, Any]) -> None:
    entries = [example["mcpServers"]["kernmind"], example["servers"]["kernmind"]]
    assert example["servers"]["kernmind"]["type"] == "stdio"
    for entry in entries:
        # absolute, as README insists: desktop clients do not inherit the shell's PATH
        assert entry["command"].startswith("/") and entry["command"].endswith("/bin/kernmind")
        args = build_parser().parse_args(entry["args"])  # exits (SystemExit) on an unknown flag
        assert args.command == "serve"
    for key in example["mcpServers"]["kernmind"].get("env", {}):
        assert key.startswith("KERNMIND_")


def test_http_entries_target_mcp_with_a_bearer_token(example: dict[str, Any]) -> None:
    cursor = example["mcpServers"]["kernmind-http"]
    vscode = example["servers"]["kernmind-http"]
    assert vscode["type"] == "http"
    for entry in (cursor, vscode):
        assert entry["url"].startswith("http://127.0.0.1:") and entry["url"].endswith("/mcp")
        assert entry["headers"]["Authorization"].startswith("Bearer ")
    token_input = vscode["headers"]["Authorization"].removeprefix("Bearer ${input:").removesuffix("}")
    assert token_input in {i["id"] for i in example["inputs"]}
    bridge = example["mcpServers"]["kernmind-http-via-mcp-remote"]
    assert cursor["url"] in bridge["args"]
    assert bridge["env"]["KERNMIND_AUTH"].startswith("Bearer ")


def test_the_agent_can_read_it(example: dict[str, Any]) -> None:
    config = pytest.importorskip("kernmind.agent.config")
    specs = config.load_mcp_config(EXAMPLE)
    assert {s.name for s in specs} == set(example["mcpServers"])

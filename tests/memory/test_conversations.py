"""Conversation memory: the bundled agent records each conversation (messages, tool calls and
results, times) in its namespace; ``conversation_search`` finds them by words and by meaning,
filtered by role and date; export/import carry them.

The model is the agent tests' scripted OpenAI-compatible server on 127.0.0.1; the MCP server is
the real ``kernmind serve`` the agent launches over stdio.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio.to_thread
import pytest
from mcp import Client

from kernmind.agent import Agent, AgentConfig, kernmind_server_spec
from kernmind.cli import main
from kernmind.config import Settings
from kernmind.memory.recorder import ConversationRecorder
from kernmind.server import create_server
from tests.agent.scripted_openai import ScriptedOpenAI, call, reply, tools

from .conftest import another_db_location, ok, refused

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def agent_settings(tmp_path: Path) -> Settings:
    return Settings(
        sandbox="none", pool_size=0, data_dir=tmp_path / "data", db=tmp_path / "km.db", agent="ada"
    )


async def recorded_run(llm: ScriptedOpenAI, settings: Settings) -> None:
    llm.add(
        tools(call("memory_append", {"label": "human", "content": "Owns a beagle called Rex."})),
        reply("Noted: Rex the beagle."),
        reply("You told me about Rex."),
    )
    config = AgentConfig(
        model="scripted",
        base_url=llm.url,
        api_key="test-key",
        servers=[kernmind_server_spec(settings, log_level="WARNING")],
        retry_base_delay=0.01,
        recorder=ConversationRecorder(settings),
    )
    async with Agent(config) as agent:
        assert (
            await agent.run("My dog is a beagle called Rex, please remember it.")
        ).answer == "Noted: Rex the beagle."
        assert (await agent.run("What do you know about my pets?")).answer == "You told me about Rex."


async def test_a_recorded_agent_run_is_searchable(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    settings = agent_settings(tmp_path)
    await recorded_run(llm, settings)
    async with Client(create_server(settings)) as client:
        out = await ok(client, "conversation_search", query="beagle Rex")
        roles = [r["role"] for r in out["results"]]
        assert out["mode"] == "hybrid" and {"user", "assistant", "tool"} <= set(roles)
        assert out["results"][0]["content"] in {
            "My dog is a beagle called Rex, please remember it.",
            "Noted: Rex the beagle.",
        }
        assert len({r["conversation_id"] for r in out["results"]}) == 1
        # the tool call is spelled out in the assistant message, its result is a tool message
        assistant = [r["content"] for r in out["results"] if r["role"] == "assistant"]
        assert any("[called memory_append with" in a for a in assistant)
        only_user = await ok(client, "conversation_search", query="Rex", roles=["user"])
        assert only_user["results"] and {r["role"] for r in only_user["results"]} == {"user"}
        # by meaning: no word in common with "My dog is a beagle …"
        meaning = await ok(client, "conversation_search", query="puppy", roles=["user"])
        # (the user's next message, "What do you know about my pets?", is read with the reply before it)
        assert any("beagle" in r["content"] for r in meaning["results"][:2])
        newest = await ok(client, "conversation_search", query="", limit=2)
        assert newest["mode"] == "recent" and newest["results"][0]["content"] == "You told me about Rex."
        assert (await ok(client, "conversation_search", query="Rex", start_date="2999-01-01"))[
            "results"
        ] == []
        text = await refused(client, "conversation_search", query="Rex", start_date="yesterday")
        assert "ISO-8601" in text
        r = await client.call_tool("conversation_search", {"query": "Rex", "roles": ["robot"]})
        assert r.is_error
    # another namespace does not see it
    async with Client(create_server(settings.model_copy(update={"agent": "other"}))) as client:
        assert (await ok(client, "conversation_search", query="beagle"))["results"] == []


async def test_export_and_import_carry_conversations(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    settings = agent_settings(tmp_path)
    await recorded_run(llm, settings)
    out = tmp_path / "ada.json"
    argv = ["memory", "export", "--db", settings.db_location, "--agent", "ada", "-o", str(out)]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    doc = json.loads(out.read_text())
    [conv] = doc["conversations"]
    assert [m["role"] for m in conv["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert conv["messages"][1]["meta"]["tool_calls"][0]["function"]["name"] == "memory_append"
    other = another_db_location(tmp_path, "other.db")
    for _ in range(2):  # importing twice adds the conversation once
        argv = ["memory", "import", str(out), "--db", str(other), "--agent", "bob", "--replace"]
        assert await anyio.to_thread.run_sync(main, argv) == 0
    moved = Settings(db=str(other), data_dir=tmp_path, agent="bob", pool_size=0, sandbox="none")
    async with Client(create_server(moved)) as client:
        found = await ok(client, "conversation_search", query="beagle", roles=["user"])
        assert [r["conversation_id"] for r in found["results"]] == [conv["id"]]
        assert len((await ok(client, "conversation_search", query="", limit=100))["results"]) == 6

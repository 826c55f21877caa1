"""The loop driving the real ``kernmind serve`` (launched over stdio, as the CLI does):
it runs code, edits memory blocks, sees the edit in the next system prompt, and Ctrl-C
(``Agent.interrupt``) cancels a running cell through MCP cancellation."""

from __future__ import annotations

import inspect
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest

from kernmind.agent import (
    Agent,
    AgentConfig,
    AgentEvents,
    ToolCallRecord,
    kernmind_server_spec,
    load_mcp_config,
)
from kernmind.config import Settings
from kernmind.memory.recorder import ConversationRecorder

from .scripted_openai import Item, ScriptedOpenAI, call, reply, tools
from .toy_server import PNG, WORDS, secret, step_report

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # a real kernmind server and kernels


class Started(AgentEvents):
    def __init__(self) -> None:
        self.started = anyio.Event()

    async def on_tool_start(self, call: ToolCallRecord) -> None:
        self.started.set()


PICTURE = f"""x = 1
import base64
from IPython.display import Image, display
display(Image(data=base64.b64decode({PNG!r})))"""


def kernmind_config(llm: ScriptedOpenAI, tmp_path: Path) -> AgentConfig:
    settings = Settings(sandbox="none", pool_size=0, data_dir=tmp_path / "data", db=tmp_path / "km.db")
    return AgentConfig(
        model="scripted",
        base_url=llm.url,
        api_key="test-key",
        servers=[kernmind_server_spec(settings, log_level="WARNING")],
        retry_base_delay=0.01,
    )


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_runs_code_and_edits_memory_seen_in_next_system_prompt(
    llm: ScriptedOpenAI, tmp_path: Path
) -> None:
    llm.add(
        tools(
            call("run_code", {"code": "x = 6 * 7\nprint('x is', x)"}),
            call("memory_append", {"label": "human", "content": "Favourite number: 42"}),
        ),
        tools(call("run_code", {"code": "x + 1"})),
        reply("x is 42 and I will remember it."),
    )
    async with Agent(kernmind_config(llm, tmp_path)) as agent:
        assert {"run_code", "memory_append", "memory_replace"} <= set(agent.hub.tools)
        result = await agent.run("compute and remember")
    assert result.answer == "x is 42 and I will remember it."
    assert [c.status for c in result.tool_calls] == ["ok", "ok", "ok"]
    code_out, memory_out = tool_messages(llm.requests[1])
    assert "x is 42" in code_out
    assert "Favourite number: 42" in memory_out  # the block's new value, echoed by the write
    assert "43" in tool_messages(llm.requests[2])[-1]  # state kept between calls
    first, second, third = llm.system_prompts()
    assert "<memory_blocks>" in first and "<human>" in first
    assert "Favourite number: 42" not in first
    assert "Favourite number: 42" in second and "Favourite number: 42" in third
    assert "run_code" in first  # server instructions are included


async def test_interrupt_cancels_the_running_cell(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    running = tmp_path / "loop-running"  # the loop's code writes it (no sandbox here): it is in the kernel
    loop = f"open({str(running)!r}, 'w').close()\nimport time\nfor _ in range(6000):\n    time.sleep(0.1)"
    llm.add(
        tools(call("run_code", {"code": PICTURE})),
        reply("set"),
        tools(call("run_code", {"code": loop})),  # 600 s unless interrupted
        tools(call("run_code", {"code": "print('alive', x)"})),
        reply("still alive"),
    )
    events = Started()
    async with Agent(kernmind_config(llm, tmp_path), events) as agent:
        assert (await agent.run("set x")).answer == "set"
        image_msg = agent.messages[-2]  # the step's images follow its tool messages
        assert image_msg["role"] == "user"
        assert image_msg["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
        events.started = anyio.Event()
        results = []

        async def turn() -> None:
            results.append(await agent.run("loop for a minute"))

        with anyio.fail_after(60):  # a hang bound only
            async with anyio.create_task_group() as tg:
                tg.start_soon(turn)
                await events.started.wait()
                while not running.exists():  # noqa: ASYNC110 - a file the kernel writes: nothing to await
                    await anyio.sleep(0.02)
                agent.interrupt()
        assert results[0].stopped == "interrupted"
        assert results[0].tool_calls[0].status == "cancelled"
        with anyio.fail_after(120):  # the cancelled cell, left running, would keep the kernel busy 600 s
            follow = await agent.run("are you there?")
    assert follow.answer == "still alive"
    assert "alive 1" in tool_messages(llm.requests[-1])[-1]


async def test_http_server_from_mcp_config(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    """An ``mcp.json`` ``url`` entry with headers: kernmind serving Streamable HTTP with a token."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "kernmind",
        "serve",
        "--transport",
        "http",
        "--port",
        str(port),
        "--token",
        "s3cret",
    ]
    cmd += [
        "--sandbox",
        "none",
        "--pool-size",
        "0",
        "--db",
        str(tmp_path / "h.db"),
        "--data-dir",
        str(tmp_path),
    ]
    proc = await anyio.open_process(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Serving, not merely listening: the port is bound before the server has imported the SDK,
        # so a connect succeeds seconds before an MCP request is answered on a busy machine.
        async with httpx2.AsyncClient(timeout=5) as http:
            with anyio.fail_after(60):
                while True:
                    try:
                        if (await http.get(f"http://127.0.0.1:{port}/mcp")).status_code == 401:
                            break
                    except httpx2.HTTPError:
                        pass
                    await anyio.sleep(0.1)
        cfg = tmp_path / "mcp.json"
        entry = {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": "Bearer s3cret"}}
        cfg.write_text(json.dumps({"mcpServers": {"remote": entry}}))
        llm.add(tools(call("run_code", {"code": "21 * 2"})), reply("42"))
        config = AgentConfig(model="scripted", base_url=llm.url, api_key="k", servers=load_mcp_config(cfg))
        async with Agent(config) as agent:
            result = await agent.run("twice 21")
        assert result.answer == "42"
        assert "42" in tool_messages(llm.requests[1])[0]
        assert "<memory_blocks>" in llm.system_prompts()[0]
    finally:
        proc.terminate()
        with anyio.fail_after(60):
            await proc.wait()


async def test_what_compaction_evicted_is_found_with_conversation_search(
    llm: ScriptedOpenAI, tmp_path: Path
) -> None:
    """25 code steps of ≈ 2,500 printed characters each in a 20,000-token window: the oldest turns
    are evicted (the summaries come back as garbage, so a plain note stands in for them), and the
    model finds step 3's output again with ``conversation_search`` — every message was recorded."""
    define = "\n".join([f"WORDS = {WORDS!r}", inspect.getsource(secret), inspect.getsource(step_report)])
    window = 20_000
    step = 0

    def respond(body: dict) -> Item:
        nonlocal step
        step += 1
        if step == 1:
            return tools(call("run_code", {"code": f"{define}\nprint(step_report(1))"}))
        if step <= 25:
            return tools(call("run_code", {"code": f"print(step_report({step}))"}))
        if step == 26:
            return tools(call("conversation_search", {"query": "step 3 secret", "limit": 3}))
        found = re.search(r"step 3 secret ([a-z]+-\d+)", tool_messages(body)[-1])
        return reply(f"Step 3's secret was {found.group(1)}." if found else "not found")

    llm.context_window, llm.responder = window, respond
    llm.summarizer = lambda body: reply("")  # a model that cannot summarise
    config = kernmind_config(llm, tmp_path)
    config.context_window, config.max_steps = window, 30
    config.recorder = ConversationRecorder(
        Settings(sandbox="none", data_dir=tmp_path / "data", db=tmp_path / "km.db")
    )
    async with Agent(config) as agent:
        assert agent.searchable
        result = await agent.run("Run the job step by step, then tell me step 3's secret.")
        evictions = [c for c in agent.window.compactions if c.evicted]
    assert result.stopped == "answer", result.answer
    assert result.answer == f"Step 3's secret was {secret(3)}."
    assert evictions and not any(c.summarized for c in evictions)
    last = llm.requests[-1]
    assert "conversation_search finds anything said earlier" in last["messages"][0]["content"]
    assert "Use conversation_search to find what they said." in last["messages"][0]["content"]
    holding = [m for m in last["messages"] if f"step 3 secret {secret(3)}" in str(m.get("content"))]
    assert [m["role"] for m in holding] == ["tool"]  # only the search result brought it back
    assert max(llm.accepted) <= window

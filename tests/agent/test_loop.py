"""The loop's mechanics against the scripted model and an in-process toy MCP server."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from kernmind.agent import Agent, AgentConfig, AgentEvents, ModelError, ServerSpec, ToolCallRecord

from .scripted_openai import ScriptedOpenAI, call, error, reply, tools
from .toy_server import build

pytestmark = pytest.mark.anyio


class Recorder(AgentEvents):
    def __init__(self, approve: bool = True) -> None:
        self.tokens: list[str] = []
        self.retries: list[tuple[int, float, str]] = []
        self.started: list[str] = []
        self.ended: list[ToolCallRecord] = []
        self.allow = approve
        self.asked: list[str] = []

    async def on_token(self, text: str) -> None:
        self.tokens.append(text)

    async def on_retry(self, attempt: int, delay: float, reason: str) -> None:
        self.retries.append((attempt, delay, reason))

    async def approve(self, call: ToolCallRecord) -> bool:
        self.asked.append(call.name)
        return self.allow

    async def on_tool_start(self, call: ToolCallRecord) -> None:
        self.started.append(call.name)

    async def on_tool_end(self, call: ToolCallRecord) -> None:
        self.ended.append(call)


def config(llm: ScriptedOpenAI, servers: list[ServerSpec], **kw: Any) -> AgentConfig:
    kw.setdefault("retry_base_delay", 0.01)
    return AgentConfig(model="scripted", base_url=llm.url, api_key="test-key", servers=servers, **kw)


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_tool_call_then_answer(llm: ScriptedOpenAI, stream: bool) -> None:
    server, state = build()
    llm.add(tools(call("add", {"a": 2, "b": 3}), content="Let me add."), reply("The sum is 5."))
    events = Recorder()
    async with Agent(config(llm, [ServerSpec("toy", server)], stream=stream), events) as agent:
        result = await agent.run("What is 2+3?")
    assert result.answer == "The sum is 5."
    assert result.stopped == "answer" and result.steps == 2
    assert state["calls"] == [("add", 2, 3)]
    first, second = llm.requests
    assert first["stream"] is True if stream else "stream" not in first
    names = {t["function"]["name"] for t in first["tools"]}
    assert {"add", "echo", "fail", "picture", "slow", "remember"} <= names
    add_schema = next(t for t in first["tools"] if t["function"]["name"] == "add")["function"]
    assert add_schema["parameters"]["properties"].keys() == {"a", "b"}
    assert first["messages"][0]["role"] == "system"
    assistant = second["messages"][2]
    assert assistant["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert tool_messages(second) == [{"role": "tool", "tool_call_id": "call_0_add", "content": "5"}]
    if stream:
        assert "".join(events.tokens) == "Let me add.The sum is 5."
        assert len(events.tokens) > 3
    else:
        assert events.tokens == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_parallel_tool_calls_run_concurrently(llm: ScriptedOpenAI, stream: bool) -> None:
    server, state = build()
    llm.add(
        tools(
            call("slow", {"seconds": 0.6}, id="a"),
            call("echo", {"text": "hi"}, id="b"),
            call("slow", {"seconds": 0.6}, id="c"),
        ),
        reply("done"),
    )
    async with Agent(config(llm, [ServerSpec("toy", server)], stream=stream)) as agent:
        result = await agent.run("go")
    assert result.answer == "done"
    assert state["most_running"] == 2, "the two slow calls did not overlap: not concurrent"
    msgs = tool_messages(llm.requests[1])
    assert [m["tool_call_id"] for m in msgs] == ["a", "b", "c"]
    assert [m["content"] for m in msgs] == ["slept", "hi", "slept"]


async def test_bad_arguments_unknown_tools_and_tool_errors_go_back_to_the_model(llm: ScriptedOpenAI) -> None:
    server, state = build()
    llm.add(
        tools(
            call("add", '{"a": 1, "b": '),
            call("add", "[1, 2]"),
            call("no_such_tool", {}),
            call("fail", {"reason": "testing"}),
            call("add", {"a": "x", "b": 1}),
        ),
        tools(call("add", {"a": 1, "b": 2})),
        reply("3"),
    )
    events = Recorder()
    async with Agent(config(llm, [ServerSpec("toy", server)]), events) as agent:
        result = await agent.run("add 1 and 2")
    assert result.answer == "3"
    bad_json, not_object, unknown, failed, invalid = (m["content"] for m in tool_messages(llm.requests[1]))
    assert "not valid JSON" in bad_json and "Call the tool again" in bad_json
    assert "must be a JSON object" in not_object
    assert "Unknown tool 'no_such_tool'" in unknown and "add" in unknown
    assert "fail was asked to fail: testing" in failed and failed.startswith("Error")
    assert invalid.startswith("Error")
    statuses = [r.status for r in result.tool_calls]
    assert statuses == ["error", "error", "error", "error", "error", "ok"]
    assert state["calls"] == [("add", 1, 2)]
    assert events.asked == ["fail", "add", "add"]  # only real calls are approved/started


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_rate_limits_and_server_errors_are_retried(llm: ScriptedOpenAI, stream: bool) -> None:
    server, _ = build()
    llm.add(
        error(429, "slow down", headers={"retry-after": "0"}),
        error(500, "oops"),
        error(503, "overloaded"),
        reply("finally"),
    )
    events = Recorder()
    async with Agent(config(llm, [ServerSpec("toy", server)], stream=stream), events) as agent:
        result = await agent.run("hi")
    assert result.answer == "finally"
    assert len(llm.requests) == 4
    assert [r[0] for r in events.retries] == [1, 2, 3]
    assert "429" in events.retries[0][2] and "rate limited" in events.retries[0][2]
    assert events.retries[0][1] == 0.0  # Retry-After honoured


async def test_retries_exhausted_or_not_retryable_are_reported(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(error(503, "overloaded"), error(503, "still overloaded"))
    async with Agent(config(llm, [ServerSpec("toy", server)], max_retries=1)) as agent:
        with pytest.raises(ModelError) as info:
            await agent.run("hi")
        assert info.value.status == 503
        text = str(info.value)
        assert "after 2 attempts" in text and "503" in text and "still overloaded" in text
        assert llm.url.rstrip("/") in text and "'scripted'" in text

        llm.add(error(401, "bad key"))
        with pytest.raises(ModelError, match=r"HTTP 401.*bad key"):
            await agent.run("again")
        assert len(llm.requests) == 3  # 401 is not retried

        llm.add(reply("back"))  # the conversation survives a failed turn
        assert (await agent.run("third")).answer == "back"
        users = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "user"]
        assert users == ["hi", "again", "third"]


async def test_memory_edit_shows_in_next_system_prompt(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(tools(call("remember", {"label": "human", "content": "Name: Ada"})), reply("Noted."))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        await agent.run("I am Ada")
        assert "Name: Ada" in await agent.memory()
    first, second = llm.system_prompts()
    assert "<memory_blocks>" in first and "Name: unknown" in first and "Name: Ada" not in first
    assert "Name: Ada" in second
    assert "toy is a toy server for tests." in first  # server instructions


async def test_memory_from_resources_when_there_is_no_prompt(llm: ScriptedOpenAI) -> None:
    server, _ = build(memory_as="resources")
    llm.add(tools(call("remember", {"label": "human", "content": "Likes tea"})), reply("Noted."))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        await agent.run("I like tea")
    first, second = llm.system_prompts()
    assert "<human>\n<description>the human block</description>\nName: unknown\n</human>" in first
    assert "Likes tea" not in first and "Likes tea" in second


async def test_server_without_memory_is_tolerated(llm: ScriptedOpenAI) -> None:
    server, _ = build(with_memory=False)
    llm.add(reply("hello"))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        assert (await agent.run("hi")).answer == "hello"
        assert await agent.memory() == ""
    assert "<memory_blocks>" not in llm.system_prompts()[0]


async def test_max_steps(llm: ScriptedOpenAI) -> None:
    server, state = build()
    llm.add(*(tools(call("echo", {"text": f"step {i}"})) for i in range(3)))
    events = Recorder()
    async with Agent(config(llm, [ServerSpec("toy", server)], max_steps=2), events) as agent:
        result = await agent.run("loop forever")
        assert result.stopped == "max_steps" and result.steps == 2
        assert "step limit" in result.answer and "2" in result.answer
        assert len(llm.requests) == 2 and len(state["calls"]) == 2
        # the conversation is still valid: every tool call has its result
        assert agent.messages[-1]["role"] == "tool"


async def test_refused_approval(llm: ScriptedOpenAI) -> None:
    server, state = build()
    llm.add(tools(call("echo", {"text": "secret"})), reply("OK, I won't."))
    events = Recorder(approve=False)
    async with Agent(config(llm, [ServerSpec("toy", server)]), events) as agent:
        result = await agent.run("echo it")
    assert result.answer == "OK, I won't."
    assert state["calls"] == [] and events.started == []
    assert result.tool_calls[0].status == "refused"
    assert "declined" in tool_messages(llm.requests[1])[0]["content"]


async def test_interrupt_cancels_the_tool_call_and_keeps_the_conversation(llm: ScriptedOpenAI) -> None:
    server, state = build()
    llm.add(tools(call("slow", {"seconds": 30}), call("echo", {"text": "quick"})), reply("Cancelled, fine."))
    events = Recorder()
    async with Agent(config(llm, [ServerSpec("toy", server)]), events) as agent:
        results = []

        async def turn() -> None:
            results.append(await agent.run("sleep"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(turn)
                await state["started"].wait()
                await anyio.sleep(0.1)
                assert agent.interrupt() is True
        result = results[0]
        assert result.stopped == "interrupted"
        statuses = {r.name: r.status for r in result.tool_calls}
        assert statuses == {"slow": "cancelled", "echo": "ok"}
        with anyio.fail_after(60):
            while not state["cancelled"]:  # noqa: ASYNC110 (the server saw the cancellation)
                await anyio.sleep(0.02)
        assert agent.interrupt() is False  # idle now
        follow = await agent.run("what happened?")
    assert follow.answer == "Cancelled, fine."
    last = llm.requests[-1]["messages"]
    slow_result = next(m for m in last if m["role"] == "tool" and m["tool_call_id"] == "call_0_slow")
    assert "cancelled" in slow_result["content"]


async def test_interrupt_during_model_request(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(reply("too late", delay=1.0), reply("second"))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        results = []

        async def turn() -> None:
            results.append(await agent.run("hi"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            while not llm.requests:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            agent.interrupt()
        assert results[0].stopped == "interrupted"
        assert (await agent.run("again")).answer == "second"


async def test_images_as_parts_or_notes(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(tools(call("picture", {})), reply("a dot"))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        await agent.run("draw")
    msgs = llm.requests[1]["messages"]
    assert msgs[-2]["role"] == "tool" and "image 1" in msgs[-2]["content"]
    parts = msgs[-1]["content"]
    assert msgs[-1]["role"] == "user"
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")

    server, _ = build()
    llm.add(tools(call("picture", {})), reply("a dot"))
    async with Agent(config(llm, [ServerSpec("toy", server)], images="off")) as agent:
        await agent.run("draw")
    msgs = llm.requests[3]["messages"]
    assert msgs[-1]["role"] == "tool" and "cannot view images" in msgs[-1]["content"]
    assert "image_url" not in json.dumps(msgs)


async def test_images_fall_back_to_notes_when_the_model_refuses_them(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(tools(call("picture", {})), error(400, "image input not supported"), reply("ok"))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        assert (await agent.run("draw")).answer == "ok"
        assert agent.images_enabled is False
    assert "image_url" in json.dumps(llm.requests[1]["messages"])
    assert "image_url" not in json.dumps(llm.requests[2]["messages"])
    assert "cannot view images" in json.dumps(llm.requests[2]["messages"])


async def test_colliding_tool_names_are_prefixed(llm: ScriptedOpenAI) -> None:
    one, one_state = build("one")
    two, two_state = build("two", with_memory=False)
    llm.add(tools(call("two__add", {"a": 1, "b": 1}), call("one__echo", {"text": "x"})), reply("2"))
    async with Agent(config(llm, [ServerSpec("one", one), ServerSpec("two", two)])) as agent:
        assert "remember" in agent.hub.tools  # unique: keeps its name
        assert {"one__add", "two__add", "one__echo", "two__echo"} <= set(agent.hub.tools)
        assert "add" not in agent.hub.tools
        await agent.run("go")
    assert two_state["calls"] == [("add", 1, 1)] and one_state["calls"] == [("echo", "x")]


async def test_transcript_is_json(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.add(tools(call("picture", {})), reply("done"))
    async with Agent(config(llm, [ServerSpec("toy", server)])) as agent:
        await agent.run("draw")
        data = json.loads(json.dumps(agent.transcript()))
    assert data["runs"][0]["answer"] == "done"
    assert data["runs"][0]["tool_calls"][0]["name"] == "picture"
    assert "elided" in json.dumps(data["messages"])
    assert "<memory_blocks>" in data["system_prompt"]

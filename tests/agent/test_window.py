"""The agent holds conversations longer than its model's window: against a scripted model with an
8,000-token window that refuses longer requests the way OpenAI does, long runs complete, the
oldest turns are replaced by a summary the model writes (or a plain note when it writes garbage),
tool calls never lose their results, and what was evicted can still be answered about."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kernmind.agent import Agent, AgentConfig, AgentEvents, ModelError, ServerSpec
from kernmind.agent.window import Compaction

from .scripted_openai import Item, ScriptedOpenAI, call, reply, tools
from .toy_server import build, secret

pytestmark = pytest.mark.anyio

WINDOW = 8000


class LongJob:
    """A scripted model for a long job: it calls ``report`` for steps 1…n, then answers what step
    3's secret was from what the request in front of it says. Its summaries keep every step's
    secret they read (or are garbage, when told to)."""

    def __init__(self, steps: int, *, garbage: str | None = None) -> None:
        self.steps = steps
        self.step = 0
        self.garbage = garbage
        self.summaries = 0

    def respond(self, body: dict[str, Any]) -> Item:
        self.step += 1
        if self.step <= self.steps:
            return tools(call("report", {"step": self.step}))
        seen = re.search(r"step 3 secret ([a-z]+-\d+)", json.dumps(body["messages"]))
        return reply(f"Step 3's secret was {seen.group(1)}." if seen else "I no longer know step 3's secret.")

    def summarize(self, body: dict[str, Any]) -> Item:
        self.summaries += 1
        if self.garbage is not None:
            return reply(self.garbage)
        found = dict.fromkeys(re.findall(r"step \d+ secret [a-z]+-\d+", body["messages"][-1]["content"]))
        return reply(
            "The user asked me to run a long job; I ran report for each step. Results: " + "; ".join(found)
        )


class Seen(AgentEvents):
    def __init__(self) -> None:
        self.compactions: list[Compaction] = []
        self.notices: list[str] = []

    async def on_compaction(self, compaction: Compaction) -> None:
        self.compactions.append(compaction)

    async def on_notice(self, text: str) -> None:
        self.notices.append(text)


def config(llm: ScriptedOpenAI, server: Any, **kw: Any) -> AgentConfig:
    kw.setdefault("retry_base_delay", 0.01)
    kw.setdefault("max_steps", 40)
    return AgentConfig(
        model="scripted", base_url=llm.url, api_key="k", servers=[ServerSpec("toy", server)], **kw
    )


def assert_calls_keep_their_results(body: dict[str, Any]) -> None:
    """In one request: every tool message answers a call made before it in that request, and
    every call made is answered."""
    called: list[str] = []
    answered: list[str] = []
    for m in body["messages"]:
        for c in m.get("tool_calls") or []:
            called.append(c["id"])
        if m["role"] == "tool":
            assert m["tool_call_id"] in called, f"a tool result without its call: {m['tool_call_id']}"
            answered.append(m["tool_call_id"])
    assert sorted(called) == sorted(answered), "an assistant tool call without its result"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_long_run_in_an_8k_window_completes_and_remembers_step_3(
    llm: ScriptedOpenAI, stream: bool
) -> None:
    server, state = build()
    job = LongJob(steps=26)
    llm.context_window, llm.responder, llm.summarizer = WINDOW, job.respond, job.summarize
    llm.models = [{"id": "scripted", "max_model_len": WINDOW}]  # the window comes from the endpoint
    events = Seen()
    async with Agent(config(llm, server, stream=stream), events) as agent:
        assert agent.window.size == WINDOW and "endpoint" in agent.window.source
        result = await agent.run("Run the 26-step job, then tell me step 3's secret.")
        transcript = agent.transcript()
    assert result.stopped == "answer" and result.steps == 27
    assert len([c for c in state["calls"] if c[0] == "report"]) == 26
    assert (
        result.answer == f"Step 3's secret was {secret(3)}."
    )  # through the summary: step 3 was long evicted
    assert result.compactions >= 2 and len(events.compactions) == result.compactions
    evictions = [c for c in events.compactions if c.evicted]
    assert len(evictions) >= 2 and all(c.summarized for c in evictions)
    assert events.compactions[0].shortened and not events.compactions[0].evicted  # old results cut first
    assert all(c.after < c.window * 0.6 for c in events.compactions)
    assert job.summaries == len(evictions)
    main = [r for r in llm.requests if "tools" in r]
    for body in main:
        assert_calls_keep_their_results(body)
    assert "<conversation_summary>" in main[-1]["messages"][0]["content"]
    assert f"step 3 secret {secret(3)}" not in json.dumps(main[-1]["messages"][1:])  # only the summary has it
    assert max(llm.accepted) <= WINDOW and len(llm.rejected) <= 1, llm.rejected
    assert transcript["compactions"] == result.compactions and transcript["context"]["window"] == WINDOW
    if stream:
        assert all(r.get("stream_options") == {"include_usage": True} for r in main)


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        ("}}}} ## 0x7f 0x7f ?? ][ <|im_end|> 42 42", "the model's summary has 2 word(s)"),
        ("the the the the the the the the the the the the", "the model's summary repeats a few words"),
        ("", "the model returned no text"),
        ("{" * 60 + " the job ran four steps " + "}" * 60, "the model's summary is not prose"),
    ],
    ids=["symbols", "repetition", "empty", "brackets"],
)
async def test_a_garbage_summary_still_evicts_with_a_plain_note(
    llm: ScriptedOpenAI, garbage: str, why: str
) -> None:
    server, _ = build()
    job = LongJob(steps=14, garbage=garbage)
    llm.context_window, llm.responder, llm.summarizer = WINDOW, job.respond, job.summarize
    events = Seen()
    async with Agent(config(llm, server, context_window=WINDOW), events) as agent:
        result = await agent.run("Run the 14-step job, then tell me step 3's secret.")
        system = agent.last_system_prompt
    assert result.stopped == "answer" and result.steps == 15
    assert result.answer == "I no longer know step 3's secret."  # honest: the summary was garbage
    evictions = [c for c in events.compactions if c.evicted]
    assert evictions and not any(c.summarized for c in events.compactions)
    assert all(c.note == why for c in evictions)
    assert f"messages were removed without a summary ({why})" in system
    assert "tool calls report ×" in system and "with their results" in system
    last = [r for r in llm.requests if "tools" in r][-1]["messages"]
    assert last[1] == {
        "role": "user",
        "content": "Run the 14-step job, then tell me step 3's secret.",
    }  # in view
    assert garbage not in system.split("<conversation_summary>")[1] if garbage else True
    assert max(llm.accepted) <= WINDOW


async def test_a_failing_summary_request_still_evicts(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    job = LongJob(steps=12)
    llm.context_window, llm.responder = WINDOW, job.respond
    llm.summarizer = lambda body: Item("error", status=500, content="summary model crashed")
    events = Seen()
    async with Agent(config(llm, server, context_window=WINDOW, max_retries=0), events) as agent:
        result = await agent.run("Run the 12-step job.")
    assert result.stopped == "answer"
    first = next(c for c in events.compactions if c.evicted)
    assert (
        not first.summarized
        and "summary request failed" in first.note
        and "summary model crashed" in first.note
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_tool_result_larger_than_the_window_is_cut_to_fit(llm: ScriptedOpenAI, stream: bool) -> None:
    server, _ = build()
    llm.context_window = WINDOW
    llm.add(tools(call("report", {"step": 3, "chars": 60_000})), reply("I saw the start of the report."))
    events = Seen()
    async with Agent(config(llm, server, context_window=WINDOW, stream=stream), events) as agent:
        result = await agent.run("Print the big report.")
    assert result.answer == "I saw the start of the report."
    second = llm.requests[-1]
    [tool_message] = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert tool_message.startswith(f"step 3 secret {secret(3)}")  # the head is kept …
    assert (
        "characters of this tool result cut to fit the context window" in tool_message
    )  # … and the cut said
    assert len(llm.rejected) == 0 and max(llm.accepted) <= WINDOW
    assert events.compactions[0].shortened == 1 and events.compactions[0].evicted == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_endpoint_saying_too_long_triggers_a_compaction_and_a_retry(
    llm: ScriptedOpenAI, stream: bool
) -> None:
    """The agent believes the window is 64k (wrong); the endpoint refuses a request with OpenAI's
    ``context_length_exceeded``: the agent reads the real window from the message, compacts and
    sends again — the turn goes on, nothing crashes."""
    server, _ = build()
    job = LongJob(steps=12)  # ≈ 9,000 tokens by the end: past 8k, far below 75 % of 64k
    llm.context_window, llm.responder, llm.summarizer = WINDOW, job.respond, job.summarize
    events = Seen()
    async with Agent(config(llm, server, context_window=64_000, stream=stream), events) as agent:
        result = await agent.run("Run the 12-step job, then tell me step 3's secret.")
        assert agent.window.size == WINDOW and agent.window.source == "the endpoint's error message"
    assert result.stopped == "answer" and result.answer == f"Step 3's secret was {secret(3)}."
    assert len(llm.rejected) == 1
    [compaction] = events.compactions
    assert compaction.reason == "the endpoint said the request was too long" and compaction.after < WINDOW


async def test_a_request_that_can_never_fit_is_a_clear_error_not_a_crash(llm: ScriptedOpenAI) -> None:
    server, _ = build()
    llm.context_window = 600  # smaller than the tools' schemas and the system prompt together
    llm.add(reply("answered"))
    llm.summarizer = lambda body: reply("The user said hello; the request did not fit the window.")
    events = Seen()
    async with Agent(config(llm, server, context_window=2048), events) as agent:
        with pytest.raises(ModelError) as info:
            await agent.run("hello")
        text = str(info.value)
        assert "does not fit the model's window even after compacting" in text
        assert "system prompt and the tools' schemas alone take" in text and "--context-window" in text
        assert len(llm.rejected) == 3  # the request, and twice again after compacting
        llm.context_window = None  # the server is given a larger window: the same agent goes on
        assert (await agent.run("again")).answer == "answered"


async def test_the_overhead_of_tools_and_prompt_is_noted_when_it_crowds_the_window(
    llm: ScriptedOpenAI,
) -> None:
    server, _ = build()
    llm.add(reply("hi"))
    events = Seen()
    async with Agent(config(llm, server, context_window=1024), events) as agent:
        await agent.run("hello")
    [notice] = events.notices
    assert "tools' schemas take" in notice and "1,024-token window" in notice

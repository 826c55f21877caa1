"""The window's small parts: the estimate, what the endpoint teaches it, groups, garbage summaries,
and how the endpoint's refusals are recognised."""

from __future__ import annotations

from typing import Any

import pytest

from kernmind.agent.compaction import groups, summary_problem
from kernmind.agent.model import ChatModel
from kernmind.agent.window import ContextWindow, clip_to_tokens, message_tokens, text_tokens

from .scripted_openai import Item, ScriptedOpenAI, error, reply

NUMBERS = "\n".join(f"step {i}: loss={1 / (i + 1):.6f} acc={0.5 + i / 400:.4f}" for i in range(60))
PROSE = "The North region grew fastest this quarter, mostly because of the duplicated import batch. " * 30


def test_printed_numbers_cost_more_tokens_per_character_than_prose() -> None:
    """Byte-pair tokenizers split numbers into one to three digits: a characters-per-token ratio
    that fits prose would underestimate tool output full of numbers by half."""
    assert len(NUMBERS) / text_tokens(NUMBERS) < 2.5 < len(PROSE) / text_tokens(PROSE)


def test_the_estimate_learns_from_usage_fast_upwards_and_slowly_downwards() -> None:
    w = ContextWindow(8000, "test")
    w.observe(1000, 1500)  # the endpoint counted more: follow at once
    assert w.scale == 1.5 and w.tokens(1000) == 1500 and w.last_reported == 1500
    w.observe(1000, 1000)  # it counted less: halfway
    assert w.scale == 1.25
    w.observe(1000, None)  # no usage figures: nothing learnt
    assert w.scale == 1.25


@pytest.mark.parametrize(
    ("message", "size", "scale"),
    [
        (  # OpenAI
            "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "10,240 tokens. Please reduce the length of the messages.",
            8192,
            2.0,
        ),
        (  # vLLM
            "This model's maximum context length is 4096 tokens. However, you requested 6144 tokens "
            "(5120 in the messages, 1024 in the completion).",
            4096,
            1.2,
        ),
        ("the request exceeds the available context size, try increasing it", 32_000, 1.2),  # llama.cpp
    ],
)
def test_a_refusal_teaches_the_window_and_the_scale(message: str, size: int, scale: float) -> None:
    w = ContextWindow(32_000, "default")
    w.learn(message, 5120)
    assert w.size == size and w.scale == pytest.approx(scale, rel=0.01)


def test_groups_keep_tool_calls_with_their_results_and_images() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "run_code", "arguments": "{}"}}
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "draw"},
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "b"}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
        {"role": "assistant", "content": "a square"},
        {"role": "user", "content": "thanks"},
    ]
    assert groups(msgs) == [[0], [1, 2, 3, 4], [5], [6]]
    assert message_tokens(msgs[4]) > 700  # an image counts as one, whatever its data's length


@pytest.mark.parametrize(
    ("text", "usable"),
    [
        ("I loaded sales.csv (50,000 rows); the user wants revenue per region; North grew 18 %.", True),
        ("", False),
        ("ok ok ok", False),
        ("data data data data data data data data data data", False),
        ("{{{{{{{{{{{{{{{{{{ [1,2,3] ]]]]]]]]]]]]]]]]]] <|im_end|> the job ran four steps", False),
    ],
)
def test_garbage_summaries_are_recognised(text: str, usable: bool) -> None:
    assert (summary_problem(text) is None) is usable


def test_clipping_keeps_head_and_tail_and_says_so() -> None:
    text = "HEAD " + NUMBERS + " TAIL"
    out = clip_to_tokens(text, 200, "[… {cut} characters cut …]")
    assert text_tokens(out) <= 200
    assert out.startswith("HEAD ") and out.endswith(" TAIL") and "characters cut" in out


@pytest.mark.anyio
@pytest.mark.parametrize(
    "refusal",
    [
        error(400, "This model's maximum context length is 4096 tokens. However, you requested 6144 tokens."),
        Item(
            "error",
            status=400,
            payload={"error": {"code": 400, "message": "too big", "type": "exceed_context_size_error"}},
        ),
        Item("error", status=400, payload={"error": {"message": "x", "code": "context_length_exceeded"}}),
    ],
    ids=["vllm-words", "llama.cpp-type", "openai-code"],
)
async def test_context_refusals_are_recognised_and_not_retried(llm: ScriptedOpenAI, refusal: Item) -> None:
    from kernmind.agent.errors import ModelError

    llm.add(refusal)
    model = ChatModel("scripted", base_url=llm.url, api_key="k", retry_base_delay=0.01)
    try:
        with pytest.raises(ModelError) as info:
            await model.complete([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()
    assert info.value.context_exceeded and not info.value.images_rejected and len(llm.requests) == 1


@pytest.mark.anyio
async def test_a_server_refusing_stream_options_is_asked_again_without(llm: ScriptedOpenAI) -> None:
    llm.add(error(400, "Unrecognized request argument supplied: stream_options"), reply("fine"))
    model = ChatModel("scripted", base_url=llm.url, api_key="k", retry_base_delay=0.01, max_retries=0)
    try:
        turn = await model.complete([{"role": "user", "content": "hi"}], [], stream=True)
    finally:
        await model.aclose()
    assert turn.content == "fine" and model.stream_usage is False
    assert "stream_options" in llm.requests[0] and "stream_options" not in llm.requests[1]

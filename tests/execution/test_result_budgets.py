"""Every code result goes through the output budget (``budget.py``): run_code's text, a job's
output, a download. What is too large is cut within the budget and says how to get the rest;
what is small comes back untouched."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.budget import Budget
from kernmind.execution.results import DisplayResult, OutputCollector, RunResult
from kernmind.execution.tools.run_content import run_result_content
from kernmind.server import create_server
from tests.conftest import make_settings, structured

BUDGET = 2000  # --max-output-chars (its smallest allowed value is 1000)
MARKER_ROOM = 300  # the cut's marker and note, beside the budget


def text_of(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


# --- the text block of a run, without a kernel ---------------------------------------------


def test_a_markdown_result_too_large_for_the_text_block_is_cut_and_names_the_field() -> None:
    collector = OutputCollector(Budget(BUDGET))
    collector.display({"text/plain": "<IPython.core.display.Markdown object>", "text/markdown": "w " * 5000})
    result = RunResult(status="ok", language="python", results=collector.results)
    blocks, structured_result = run_result_content(result, Budget(BUDGET))
    text = blocks[0].text
    assert len(text) <= BUDGET + MARKER_ROOM
    assert "results[0].markdown" in text and "left out to stay within the output budget" in text
    assert structured_result["results"][0]["markdown"] == "w " * 5000  # the whole form is there


def test_a_small_markdown_result_is_shown_whole() -> None:
    result = RunResult(
        status="ok", language="python", results=[DisplayResult(text="<x.Markdown object>", markdown="**hi**")]
    )
    blocks, _ = run_result_content(result, Budget(BUDGET))
    assert blocks[0].text == "**hi**"


def test_many_changed_files_are_named_within_the_budget() -> None:
    from kernmind.execution.results import FileInfo

    files = [FileInfo(path=f"{'d' * 100}/f{i}.txt", size=1, mime="text/plain") for i in range(50)]
    blocks, data = run_result_content(RunResult(status="ok", language="python", files=files), Budget(BUDGET))
    assert len(blocks[0].text) <= BUDGET + MARKER_ROOM
    assert "more files left out to stay within the output budget" in blocks[0].text
    assert len(data["files"]) == 50
    few, _ = run_result_content(RunResult(status="ok", language="python", files=files[:2]), Budget(BUDGET))
    assert few[0].text == f"[files] {files[0].path} (1 B), {files[1].path} (1 B)"


def test_a_traceback_keeps_both_ends_within_its_share() -> None:
    collector = OutputCollector(Budget(BUDGET))
    tb = (
        "Traceback (most recent call last)\n"
        + "".join(f"  frame {i}\n" for i in range(2000))
        + "ValueError: end"
    )
    collector.set_error("ValueError", "end", tb)
    assert collector.error is not None and collector.truncated
    kept = collector.error.traceback
    assert len(kept) <= collector.tail_budget * 2
    assert kept.startswith("Traceback") and kept.endswith("ValueError: end") and "text truncated" in kept
    small = OutputCollector(Budget(BUDGET))
    small.set_error("ValueError", "end", "Traceback\nValueError: end")
    assert small.error is not None and small.error.traceback == "Traceback\nValueError: end"
    assert not small.truncated


def test_output_and_traceback_together_stay_within_one_budget() -> None:
    """A flood of output then a long traceback: the output's tail gives way, the head stays."""
    collector = OutputCollector(Budget(BUDGET))
    for i in range(5000):
        collector.stream("stdout", f"line {i}\n")
    tb = (
        "Traceback (most recent call last)\n"
        + "".join(f"  frame {i}\n" for i in range(2000))
        + "ValueError: end"
    )
    collector.set_error("ValueError", "end", tb)
    logs = collector.logs()
    shown = "".join(logs.stdout) + "".join(logs.stderr)
    assert collector.error is not None
    assert collector.error.traceback.endswith("ValueError: end")
    assert shown.startswith("line 0\n")
    assert len(shown) + len(collector.error.traceback) <= BUDGET + 2 * MARKER_ROOM
    # half the output, then a short traceback: the tail is kept as before
    quiet = OutputCollector(Budget(BUDGET))
    for i in range(5000):
        quiet.stream("stdout", f"line {i}\n")
    quiet.set_error("ValueError", "end", "Traceback\nValueError: end")
    assert "".join(quiet.logs().stdout).endswith("line 4999\n")


# --- through the server, with real kernels ---------------------------------------------------


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    settings = make_settings(tmp_path_factory.mktemp("budgets"), pool_size=1, max_output_chars=BUDGET)
    async with Client(create_server(settings)) as c:
        yield c


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_run_code_output_is_cut_within_the_budget_and_small_output_is_untouched(client: Client) -> None:
    small = await client.call_tool("run_code", {"code": "print('hi')", "session_id": "b1"})
    assert structured(small)["truncated"] is False and text_of(small) == "hi"
    flood = await client.call_tool("run_code", {"code": "print('x' * 100_000)", "session_id": "b1"})
    data = structured(flood)
    assert data["truncated"] is True and "output truncated" in text_of(flood)
    assert len("".join(data["logs"]["stdout"])) <= BUDGET + MARKER_ROOM


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_large_markdown_display_is_cut_in_the_text_and_whole_in_the_structured_result(
    client: Client,
) -> None:
    code = "from IPython.display import Markdown, display\ndisplay(Markdown('word ' * 20_000))"
    got = await client.call_tool("run_code", {"code": code, "session_id": "b2"})
    data = structured(got)
    assert len(got.content[0].text) <= BUDGET + MARKER_ROOM
    assert "results[0].markdown" in got.content[0].text
    assert data["results"][0]["markdown"] == "word " * 20_000


async def _job_state(client: Client, job_id: str, predicate: Any) -> tuple[Any, dict[str, Any]]:
    with anyio.fail_after(60):
        while True:
            got = await client.call_tool("job_status", {"job_id": job_id})
            if predicate(structured(got)):
                return got, structured(got)
            await anyio.sleep(0.2)


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_running_jobs_output_is_cut_to_its_latest_part_and_says_where_the_rest_is(
    client: Client,
) -> None:
    # (under twice the budget: the kernel sends it as printed; past that, see the next test)
    code = "for i in range(50): print(f'line {i:04}', 'y' * 60)\nimport time\ntime.sleep(60)"
    started = structured(
        await client.call_tool("run_code", {"code": code, "session_id": "b3", "background": True})
    )
    got, status = await _job_state(
        client,
        started["job_id"],
        lambda s: s["state"] == "running" and "line 0049" in "".join(s["output"]["stdout"]),
    )
    text = text_of(got)
    assert len(text) <= 2000 + MARKER_ROOM and "line 0049" in text
    assert "structured output holds its head and tail" in text
    out = "".join(status["output"]["stdout"])
    assert "line 0000" in out and "line 0049" in out and len(out) <= BUDGET + MARKER_ROOM
    await client.call_tool("job_cancel", {"job_id": started["job_id"]})

    quick = structured(
        await client.call_tool("run_code", {"code": "print('done')", "session_id": "b4", "background": True})
    )
    got, status = await _job_state(client, quick["job_id"], lambda s: s["state"] != "running")
    assert status["result"]["logs"]["stdout"] == ["done\n"] and status["result"]["truncated"] is False
    assert text_of(got).endswith("\ndone")


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_job_that_floods_its_output_shows_its_latest_lines_while_it_runs(client: Client) -> None:
    """Past twice the budget the kernel holds only a tail of the output, and sends it once a
    second (``Budget.kernel_cap``): ``job_status`` shows the newest lines before the job ends,
    and neither the running job's output nor its result leaves the budget."""
    code = (
        "import os, sys, time\n"
        "for i in range(4000): print(f'line {i:05}')\n"  # 44,000 characters: 22 times the budget
        "print('printed all; waiting', flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists('go') and time.monotonic() < deadline: time.sleep(0.05)\n"
        "print('went on')"
    )
    started = structured(
        await client.call_tool("run_code", {"code": code, "session_id": "b5", "background": True})
    )
    got, status = await _job_state(
        client,
        started["job_id"],
        lambda s: s["state"] != "running" or "waiting" in "".join(s["output"]["stdout"]),
    )
    assert status["state"] == "running", status  # seen while the job waits for its 'go' file
    out = "".join(status["output"]["stdout"])
    assert out.startswith("line 00000\n") and "line 03999\nprinted all; waiting\n" in out
    assert status["truncated"] is True and len(out) <= BUDGET + MARKER_ROOM
    assert len(text_of(got)) <= BUDGET + MARKER_ROOM
    dropped = int(out.split("output truncated: ")[1].split(" ")[0])

    await client.call_tool("upload_file", {"path": "go", "content": "", "session_id": "b5"})
    got, status = await _job_state(client, started["job_id"], lambda s: s["state"] != "running")
    result = "".join(status["result"]["logs"]["stdout"])
    assert status["state"] == "done" and result.endswith("printed all; waiting\nwent on\n")
    assert result.startswith("line 00000\n") and len(result) <= BUDGET + MARKER_ROOM
    # Every character printed is either shown or counted in the marker, once.
    whole = 4000 * 11 + len("printed all; waiting\n") + len("went on\n")
    final_dropped = int(result.split("output truncated: ")[1].split(" ")[0])
    shown = sum(len(x) for x in status["result"]["logs"]["stdout"] if "output truncated" not in x)
    assert final_dropped >= dropped and final_dropped + shown == whole


@pytest.mark.slow  # a real server and kernel
@pytest.mark.anyio
@pytest.mark.xdist_group("python")
async def test_a_download_too_large_goes_by_link_and_parts_fit_the_budget(
    client: Client, tmp_path: Path
) -> None:
    text = "a" * (BUDGET - 1) + "é" + "tail"  # 'é' is 2 bytes, across the end of the first part
    await client.call_tool("upload_file", {"path": "t.txt", "content": text, "session_id": "b5"})
    whole = structured(await client.call_tool("download_file", {"path": "t.txt", "session_id": "b5"}))
    assert whole["complete"] is False and whole["content"] is None
    assert "offset/length" in whole["note"] and whole["resource"] == "workspace://b5/t.txt"
    first = structured(
        await client.call_tool(
            "download_file", {"path": "t.txt", "session_id": "b5", "offset": 0, "length": BUDGET}
        )
    )
    assert first["encoding"] == "utf-8" and first["content"] == "a" * (BUDGET - 1)  # no half character
    assert f"the next part starts at offset {BUDGET - 1}" in first["note"]
    rest = structured(
        await client.call_tool("download_file", {"path": "t.txt", "session_id": "b5", "offset": BUDGET - 1})
    )
    assert rest["content"] == "étail" and "end of the file" in rest["note"]

    # Binary travels as base64 (4 characters per 3 bytes): a part holds fewer bytes to fit.
    blob = bytes(range(256)) * 7  # 1792 bytes: under the budget, its base64 (2392) is not
    await client.call_tool(
        "upload_file",
        {
            "path": "b.bin",
            "content": base64.b64encode(blob).decode(),
            "encoding": "base64",
            "session_id": "b5",
        },
    )
    linked = structured(await client.call_tool("download_file", {"path": "b.bin", "session_id": "b5"}))
    assert linked["complete"] is False and linked["content"] is None and linked["resource"]
    part = structured(
        await client.call_tool(
            "download_file", {"path": "b.bin", "session_id": "b5", "offset": 0, "length": BUDGET}
        )
    )
    assert part["encoding"] == "base64" and len(part["content"]) <= BUDGET
    assert base64.b64decode(part["content"]) == blob[: part["length"]]
    assert f"the next part starts at offset {part['length']}" in part["note"]

    small = structured(
        await client.call_tool(
            "upload_file", {"path": "s.bin", "content": "AP8B", "encoding": "base64", "session_id": "b5"}
        )
    )
    assert small["size"] == 3
    got = structured(await client.call_tool("download_file", {"path": "s.bin", "session_id": "b5"}))
    assert got["complete"] is True and got["content"] == "AP8B" and got.get("note") is None

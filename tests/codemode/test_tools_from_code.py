"""Code mode in-process (the stdio user, ``local``): every memory tool is a Python function in the
session's code, with the tool's own signature, results and refusals, and a call from code meets the
same versions, undo and limits as a call from the client.

Real kernels in the real sandbox, on both kinds of kernels (fork-server forks and kernels started
the normal way), real SQLite; no embedding model (meaning search is not what is tested here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.codemode.dispatch import in_family
from kernmind.server import create_server
from tests.codemode.conftest import run, run_emitting
from tests.conftest import error_text, make_settings, structured

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("codemode"), pytest.mark.slow]


@pytest.fixture(scope="module", params=["fork-server", "plain-kernels"])
async def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    data = tmp_path_factory.mktemp("codemode")
    settings = make_settings(
        data, embedding_model="none", fork_server=request.param == "fork-server", preload=[], max_sessions=32
    )
    async with Client(create_server(settings)) as c:
        yield c


async def memory_family(client: Client) -> list[str]:
    return sorted(t.name for t in (await client.list_tools()).tools if in_family(t.name))


async def test_each_allowed_tool_is_a_function_returning_the_tools_structured_result(client: Client) -> None:
    (names, created, read, appended, replaced, inserted, rethought, history, undone, listing, viewed,
     stored, found, conversations, deleted_passage, deleted_block) = await run_emitting(
        client,
        """
import kernmind_tools as km
emit(km.tools())
emit(km.memory_create(label="notes", value="alpha", description="from code"))
emit(km.memory_read(label="notes"))
emit(km.memory_append(label="notes", content="beta"))
emit(km.memory_replace(label="notes", old_str="alpha", new_str="gamma"))
emit(km.memory_insert(label="notes", new_str="top", insert_line=0))
emit(km.memory_rethink(label="notes", new_memory="rethought"))
emit(km.memory_history(label="notes"))
emit(km.memory_undo(label="notes"))
emit(km.memory_list())
emit(km.memory(command="view", path="/memories/notes"))
passage = km.archival_memory_insert(content="the churn peaked in March", tags=["finding"])
emit(passage)
emit(km.archival_memory_search(query="churn", tags=["finding"]))
emit(km.conversation_search(query="churn"))
emit(km.archival_memory_delete(id=passage["id"]))
emit(km.memory_delete(label="notes"))
""",
        session_id="every-tool",
    )  # fmt: skip
    assert names == await memory_family(client)
    assert {"memory", "archival_memory_insert", "conversation_search", "memory_undo"} <= set(names)
    assert "run_code" not in names and "install_packages" not in names

    assert created["label"] == "notes" and created["version"] >= 1
    assert read["value"] == "alpha" and read["description"] == "from code"
    versions = [created["version"], appended["version"], replaced["version"], inserted["version"]]
    assert versions == sorted(set(versions)), versions  # every write made a new version
    assert rethought["version"] > inserted["version"]
    assert history["entries"][0]["new"] == "rethought"  # newest first
    assert "notes" in {b["label"] for b in listing["blocks"]}
    assert viewed.endswith("1\ttop\n     2\tgamma\n     3\tbeta")  # the memory tool's text, as a str
    assert isinstance(stored["id"], int) and stored["duplicate_of"] is None
    assert [r["content"] for r in found["results"]] == ["the churn peaked in March"]
    assert "results" in conversations
    assert deleted_passage["id"] == stored["id"] and deleted_passage["deleted"] is True
    assert undone["reverted"]["new"] == "rethought" and undone["block"]["value"] == "top\ngamma\nbeta"

    # The same shapes as a client's calls, and the client sees what code did (and undoes it).
    refusal = error_text(await client.call_tool("memory_read", {"label": "notes"}))
    assert "notes" in refusal
    assert deleted_block["deleted"] is True and deleted_block["label"] == "notes"
    restored = structured(await client.call_tool("memory_undo", {"label": "notes"}))
    again = structured(await client.call_tool("memory_read", {"label": "notes"}))
    assert again["value"] == "top\ngamma\nbeta", (restored, again)
    assert set(again) == set(read)


async def test_help_lists_the_tools_with_their_signatures_and_descriptions(client: Client) -> None:
    help_text, signatures, doc = await run_emitting(
        client,
        """
import inspect, pydoc, kernmind_tools as km
emit(pydoc.render_doc(km, renderer=pydoc.plaintext))
emit({name: str(inspect.signature(getattr(km, name))) for name in km.tools()})
emit(km.archival_memory_search.__doc__)
""",
        session_id="help",
    )
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in await memory_family(client):
        assert name in help_text
        assert name in signatures
    assert "ToolError" in help_text and "call(" in help_text
    assert signatures["archival_memory_insert"].startswith("(content: str, tags: list[str] = [],")
    assert signatures["memory_read"].startswith("(label: str, view_range:")
    assert "'any' | 'all' = 'any'" in signatures["archival_memory_search"]
    assert (tools["archival_memory_search"].description or "")[:60] in doc
    assert "top_k: int (default 10)" in doc


async def client_refusal(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    return error_text(await client.call_tool(tool, arguments))


async def test_refusals_raise_tool_error_with_the_sentence_a_client_gets(client: Client) -> None:
    structured(await client.call_tool("memory_create", {"label": "plans", "value": "one"}))
    structured(await client.call_tool("memory_create", {"label": "tiny", "value": "small", "limit": 20}))
    cases: list[tuple[str, dict[str, Any]]] = [
        ("archival_memory_insert", {"contnet": "misspelt"}),
        ("memory_read", {"label": "no-such-block"}),
        ("memory_append", {"label": "plans", "content": "x", "expected_version": 999}),
        ("archival_memory_search", {"query": "x", "top_k": "ten"}),
        ("memory_replace", {"label": "plans", "old_str": "absent", "new_str": "y"}),
        ("archival_memory_delete", {"id": 123456}),
        (
            "memory_append",
            {"label": "tiny", "content": "far more than twenty characters"},
        ),  # the block's limit
        ("archival_memory_insert", {"content": "x" * 20_000}),  # --archival-max-chars
    ]
    code = "import kernmind_tools as km\n" + "".join(
        f"try:\n    km.call({tool!r}, **{arguments!r})\n    emit(None)\n"
        f"except km.ToolError as e:\n    emit([type(e).__name__, str(e)])\n"
        for tool, arguments in cases
    )
    answers = await run_emitting(client, code, session_id="refusals")
    for (tool, arguments), answer in zip(cases, answers, strict=True):
        assert answer is not None, f"{tool}{arguments} was not refused from code"
        kind, sentence = answer
        assert kind == "ToolError"
        assert sentence == await client_refusal(client, tool, arguments), tool
    assert "did you mean 'content'?" in answers[0][1] and "Valid arguments: content" in answers[0][1]
    # A refused write changed nothing.
    assert structured(await client.call_tool("memory_read", {"label": "plans"}))["value"] == "one"
    assert structured(await client.call_tool("memory_read", {"label": "tiny"}))["value"] == "small"


async def test_other_tools_are_refused_with_what_code_may_call(client: Client) -> None:
    (not_memory, misspelt, direct, positional) = await run_emitting(
        client,
        """
import kernmind_tools as km
for name in ("run_code", "archival_memory_serch"):
    try:
        km.call(name, code="print(1)")
    except km.ToolError as e:
        emit(str(e))
try:
    km.run_code
except AttributeError as e:
    emit(str(e))
emit(km.archival_memory_search("never stored words", None, "any", 3)["results"])
""",
        session_id="others",
    )
    family = await memory_family(client)
    assert not_memory.startswith("run_code cannot be called from code")
    assert all(name in not_memory for name in family)
    assert "did you mean 'archival_memory_search'?" in misspelt
    assert "has no attribute 'run_code'" in direct
    assert positional == []


async def test_a_call_from_code_and_one_from_the_client_racing_on_one_block_lose_no_update(
    client: Client,
) -> None:
    """Both sides append 15 lines with ``expected_version``, re-reading after a refusal: every line
    ends up in the block exactly once, whoever won each race."""
    created = structured(
        await client.call_tool("memory_create", {"label": "race", "value": "start", "limit": 20000})
    )
    code = """
import kernmind_tools as km
refused = 0
for i in range(15):
    while True:
        version = km.memory_read(label="race")["version"]
        try:
            km.memory_append(label="race", content=f"code {i}", expected_version=version)
            break
        except km.ToolError as e:
            assert "version" in str(e), e
            refused += 1
emit(refused)
"""
    refused_client = 0
    code_refused: list[int] = []

    async def from_code() -> None:
        code_refused.extend(await run_emitting(client, code, session_id="race"))

    async def from_client() -> None:
        nonlocal refused_client
        for i in range(15):
            while True:
                version = structured(await client.call_tool("memory_read", {"label": "race"}))["version"]
                result = await client.call_tool(
                    "memory_append", {"label": "race", "content": f"client {i}", "expected_version": version}
                )
                if not result.is_error:
                    break
                assert "version" in error_text(result)
                refused_client += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(from_code)
        tg.start_soon(from_client)
    block = structured(await client.call_tool("memory_read", {"label": "race"}))
    lines = block["value"].splitlines()
    assert sorted(lines) == sorted(
        ["start", *(f"code {i}" for i in range(15)), *(f"client {i}" for i in range(15))]
    )
    history = structured(await client.call_tool("memory_history", {"label": "race", "limit": 100}))
    # the create and 30 appends, none lost, and a refused append (retried) wrote nothing
    assert len(history["entries"]) == 31
    assert block["version"] == created["version"] + 30
    assert len(code_refused) == 1 and isinstance(code_refused[0], int)  # the code ran to its end


async def test_reset_gives_a_fresh_interpreter_where_code_mode_works_again(client: Client) -> None:
    first = await run_emitting(
        client, "import kernmind_tools as km\nemit(km.archival_memory_insert(content='before reset')['id'])",
        session_id="reset",
    )  # fmt: skip
    second = await run_emitting(
        client,
        "emit('km' in globals())\nimport kernmind_tools as km\n"
        "emit([r['id'] for r in km.archival_memory_search(query='before reset')['results']])",
        session_id="reset",
        reset=True,
    )
    assert second == [False, first]


async def test_500_inserts_from_one_run_code_call_are_all_stored(client: Client) -> None:
    (ids,) = await run_emitting(
        client,
        """
import kernmind_tools as km
emit([km.archival_memory_insert(content=f"bulk finding {i}: segment {i % 13} grew {i % 17}%", tags=["bulk"])["id"]
      for i in range(500)])
""",
        session_id="bulk",
        timeout=300,
    )
    assert len(set(ids)) == 500
    seen: set[int] = set()
    for page in range(5):
        found = structured(
            await client.call_tool(
                "archival_memory_search", {"query": "", "tags": ["bulk"], "top_k": 100, "page": page}
            )
        )
        seen |= {r["id"] for r in found["results"]}
    assert seen == set(ids)


async def test_import_works_in_code_the_session_starts_as_a_process(client: Client) -> None:
    result = await run(
        client,
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'import kernmind_tools as km; "
        'print(isinstance(km.memory_list()["total"], int))\'], capture_output=True, text=True).stdout)',
        session_id="child",
    )
    assert result["status"] == "ok"
    assert "True" in "".join(result["logs"]["stdout"]), result


async def test_a_write_from_code_notifies_the_blocks_subscribers(client: Client) -> None:
    structured(await client.call_tool("memory_create", {"label": "watched", "value": "v1"}))
    events: list[Any] = []
    two = anyio.Event()
    async with client.listen(resource_subscriptions=["memory://blocks/watched", "memory://blocks"]) as sub:

        async def collect() -> None:
            async for event in sub:
                events.append(event)
                if len(events) >= 2:
                    two.set()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await run_emitting(
                client,
                "import kernmind_tools as km\n"
                "emit(km.memory_append(label='watched', content='from code')['version'])\n"
                "emit(km.memory_create(label='watched_too')['version'])",
                session_id="notify",
            )
            with anyio.fail_after(30):
                await two.wait()
            tg.cancel_scope.cancel()
    assert [str(getattr(e, "uri", "")) for e in events] == ["memory://blocks/watched", "memory://blocks"]


async def test_run_codes_description_says_code_mode_exists(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    description = tools["run_code"].description or ""
    assert "import kernmind_tools" in description and "km.ToolError" in description


async def test_numpy_and_pandas_values_go_as_the_plain_data_they_stand_for(client: Client) -> None:
    (stored, deleted, refusal) = await run_emitting(
        client,
        """
import numpy as np, pandas as pd, kernmind_tools as km
df = pd.DataFrame({"note": ["a dataframe row"], "day": [pd.Timestamp("2024-03-05")]})
row = df.iloc[0]
stored = km.archival_memory_insert(content=row["note"], tags=np.array(["df", "row"]), occurred_at=row["day"])
emit(stored)
emit(km.archival_memory_delete(id=np.int64(stored["id"])))
try:
    km.archival_memory_search(query="x", top_k=object())
except km.ToolError as e:
    emit(str(e))
""",
        session_id="numpy",
    )
    assert stored["occurred_at"].startswith("2024-03-05") and stored["duplicate_of"] is None
    assert deleted["id"] == stored["id"] and deleted["deleted"] is True
    assert "cannot be sent as JSON" in refusal


async def test_text_that_utf8_cannot_hold_reaches_the_tool_which_decides(client: Client) -> None:
    (answer,) = await run_emitting(
        client,
        """
import kernmind_tools as km
try:
    emit(["stored", km.archival_memory_insert(content="half a pair: \\ud800 and café")["id"]])
except km.ToolError as e:
    emit(["refused", str(e)])
""",
        session_id="surrogates",
    )
    client_says = await client.call_tool(
        "archival_memory_insert", {"content": "half a pair: \ud800 and café"}
    )
    if answer[0] == "refused":  # the same decision, in the same words, as for a client
        assert client_says.is_error and error_text(client_says) == answer[1]
    else:
        assert not client_says.is_error

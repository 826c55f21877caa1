"""One error boundary: refusals read as sentences, faults as ``internal error (ref …)``.

Every case runs a real kernmind server in-process over a real MCP client. Refusals from each
family (memory, the memory-tool dialect, sessions and workspaces, jobs, arguments, full
disks) reach the client as the sentence their part wrote; a fault planted in a real
component — a ``KeyError``, a ``ValueError`` that looks like a sentence, a pydantic
``ValidationError`` or a ``JSONDecodeError`` raised by our own code — reaches it as an
internal error with a ref, never as a complaint about the caller's arguments, and the log
holds the traceback under that ref. Resource reads get the same treatment.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from kernmind import boundary
from kernmind.execution.sessions.jobs import Jobs
from kernmind.memory.archival import Archive
from kernmind.memory.archival_tools import Passage
from kernmind.memory.block_store import Blocks
from kernmind.memory.errors import MemoryRefusal
from kernmind.refusals import Refusal
from kernmind.server import create_server
from kernmind.tokens_file import TokenFile
from tests.codemode.conftest import run_emitting
from tests.conftest import error_text, make_settings, structured
from tests.memory.postgres_server import PostgresServer
from tests.transport.procs import HttpServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

INTERNAL = re.compile(r"internal error \(ref ([0-9a-f]{8})\): ")


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MCPServer]:
    data = tmp_path_factory.mktemp("boundary")
    yield create_server(make_settings(data, pool_size=0, sandbox="none"))


@pytest.fixture(scope="module")
async def client(server: MCPServer) -> AsyncIterator[Client]:
    async with Client(server) as c:
        yield c


async def call(client: Client, tool: str, **arguments: Any) -> str:
    return error_text(await client.call_tool(tool, arguments))


def logged_under(caplog: pytest.LogCaptureFixture, ref: str) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if r.name == "kernmind.boundary" and ref in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    return record


# ------------------------------------------------------------------ refusals keep their text


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        (  # memory (block tools' words)
            "memory_read",
            {"label": "nope"},
            "Error executing tool memory_read: There is no memory block labelled 'nope'.",
        ),
        (  # the memory-tool dialect: the same refusal in its own words
            "memory",
            {"command": "view", "path": "/memories/nope"},
            "Error executing tool memory: The path /memories/nope does not exist.",
        ),
        (  # a memory-tool command without what it needs
            "memory",
            {"command": "create"},
            "Error executing tool memory: create needs path, file_text; missing: path, file_text.",
        ),
        (  # a memory argument only the domain can judge
            "archival_memory_search",
            {"query": "x", "start_datetime": "the day after tomorrow"},
            "Error executing tool archival_memory_search: 'the day after tomorrow' is not an ISO-8601 date",
        ),
        (  # an argument the tool refuses beyond its schema
            "upload_file",
            {"path": "a.bin", "content": "%%%", "encoding": "base64"},
            "Error executing tool upload_file: content is not valid base64",
        ),
        (  # sessions and workspaces
            "download_file",
            {"path": "a.txt", "session_id": "never-made"},
            "Error executing tool download_file: no session named 'never-made'",
        ),
        (  # jobs
            "job_status",
            {"job_id": "no-such-job"},
            "Error executing tool job_status: no job 'no-such-job'",
        ),
        (  # arguments the schema refuses (tool_arguments.py, before the tool runs)
            "memory_read",
            {"label": "human", "lable": "x"},
            "Invalid arguments for memory_read: 'lable' is not an argument of this tool",
        ),
    ],
)
async def test_a_refusal_of_each_family_reads_as_its_sentence(
    client: Client, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    text = await call(client, tool, **arguments)
    assert text.startswith(expected), text
    assert "internal error" not in text


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("upload_file", {"path": "a\x00b", "content": "x"}),
        ("download_file", {"path": "a\x00b"}),
        ("list_files", {"path": "a\x00"}),
        ("download_file", {"path": "../../etc/passwd"}),
        ("memory_read", {"label": "a\x00b"}),
        ("memory", {"command": "view", "path": "/memories/a\x00"}),
        ("close_session", {"session_id": "a\x00"}),
        ("run_code", {"language": "cobol", "code": "x"}),
        ("install_packages", {"packages": ["a\x00b"]}),
        ("job_cancel", {"job_id": "x\x00"}),
        ("export_notebook", {"session_id": "never-run"}),
    ],
)
async def test_hostile_arguments_are_refused_in_words_not_internal_errors(
    client: Client, tool: str, arguments: dict[str, Any]
) -> None:
    """Inputs that make the standard library raise ``ValueError`` (a NUL byte in a path, a bad
    requirement) are checked by their part and refused: none reaches the boundary as a fault."""
    text = await call(client, tool, **arguments)
    assert text.startswith(f"Error executing tool {tool}: "), text
    assert "internal error" not in text


async def test_the_dialect_words_its_refusal_in_its_own_verbs(client: Client) -> None:
    text = await call(client, "memory", command="view", path="/memories/nope")
    assert "memory_read" not in text and "memory_create" not in text, text


async def test_a_refusal_inside_a_task_group_reads_the_same(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def search(self: Archive, *args: Any, **kwargs: Any) -> Any:
        raise ExceptionGroup(
            "a task group", [MemoryRefusal("top_k must be at least 1, got {top_k}.", top_k=0)]
        )

    monkeypatch.setattr(Archive, "search", search)
    text = await call(client, "archival_memory_search", query="x")
    assert text == "Error executing tool archival_memory_search: top_k must be at least 1, got 0."


async def test_a_full_disk_under_any_tool_says_so(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    async def search(self: Archive, *args: Any, **kwargs: Any) -> Any:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("while reading the index") from exc

    monkeypatch.setattr(Archive, "search", search)
    text = await call(client, "archival_memory_search", query="x")
    assert text.startswith(
        "Error executing tool archival_memory_search: the disk is full: could not complete this call."
    ), text


# ------------------------------------------------------------------ faults are ours, with a ref


def _key_error(*args: Any, **kwargs: Any) -> Any:
    return {}["planted"]


def _value_error(*args: Any, **kwargs: Any) -> Any:
    raise ValueError("limit must be between 1 and 100.")  # reads like a refusal, is a bug


def _validation_error(*args: Any, **kwargs: Any) -> Any:
    return Passage.model_validate({"id": "not a number"})  # our own model, not the caller's arguments


def _json_error(*args: Any, **kwargs: Any) -> Any:
    return json.loads("{not json")


@pytest.mark.parametrize("fault", [_key_error, _value_error, _validation_error, _json_error])
async def test_a_planted_bug_is_an_internal_error_logged_under_its_ref(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: Any
) -> None:
    async def search(self: Archive, *args: Any, **kwargs: Any) -> Any:
        return fault()

    monkeypatch.setattr(Archive, "search", search)
    with caplog.at_level(logging.ERROR, logger="kernmind.boundary"):
        text = await call(client, "archival_memory_search", query="x")
    assert text.startswith("Error executing tool archival_memory_search: internal error (ref "), text
    assert "Try again" in text and "operator" in text
    for blame in ("Invalid arguments", "limit must be", "validation error", "planted", "Expecting"):
        assert blame not in text, text  # nothing of the fault, nothing that blames the caller
    match = INTERNAL.search(text)
    assert match is not None
    record = logged_under(caplog, match.group(1))
    assert "archival_memory_search" in record.getMessage()
    formatted = logging.Formatter().format(record)
    assert "Traceback" in formatted and fault.__name__ in formatted  # the traceback, under the ref


async def test_each_fault_gets_its_own_ref(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Archive, "search", lambda *a, **k: _key_error())
    refs = set()
    for _ in range(3):
        match = INTERNAL.search(await call(client, "archival_memory_search", query="x"))
        assert match is not None
        refs.add(match.group(1))
    assert len(refs) == 3


async def test_a_fault_in_the_execution_tools_is_an_internal_error_too(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Jobs, "get", _value_error)
    text = await call(client, "job_status", job_id="j-1")
    assert INTERNAL.search(text), text
    assert "limit must be" not in text


async def test_the_server_keeps_serving_after_a_fault(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(Archive, "search", lambda *a, **k: _key_error())
        assert INTERNAL.search(await call(client, "archival_memory_search", query="x"))
    result = structured(await client.call_tool("archival_memory_search", {"query": "x"}))
    assert result["results"] == []


# ------------------------------------------------------------------ resources/read


async def test_a_resource_refusal_is_its_sentence_and_missing_is_not_found(client: Client) -> None:
    with pytest.raises(MCPError) as raised:
        await client.read_resource("memory://blocks/nope")
    assert raised.value.error.code == INVALID_PARAMS
    assert raised.value.error.message.startswith("There is no memory block labelled 'nope'.")

    with pytest.raises(MCPError) as raised:
        await client.read_resource("workspace://never-made/a.txt")
    assert raised.value.error.code == INTERNAL_ERROR
    assert "internal error" not in raised.value.error.message
    assert "never-made" in raised.value.error.message, raised.value.error.message


async def test_a_fault_in_a_resource_read_is_an_internal_error_with_its_ref(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def get(self: Blocks, label: str) -> Any:
        return {}["planted"]

    monkeypatch.setattr(Blocks, "get", get)
    with caplog.at_level(logging.ERROR, logger="kernmind.boundary"):
        with pytest.raises(MCPError) as raised:
            await client.read_resource("memory://blocks/human")
    message = raised.value.error.message
    assert raised.value.error.code == INTERNAL_ERROR
    match = INTERNAL.match(message)
    assert match is not None, message
    assert "planted" not in message
    record = logged_under(caplog, match.group(1))
    assert "memory://blocks/human" in record.getMessage()


# ------------------------------------------------------------------ prompts/get


async def test_a_prompt_refusal_is_its_sentence_and_a_fault_has_a_ref(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def refuse(self: Blocks, *args: Any) -> Any:
        raise MemoryRefusal("Memory is being moved; try again in a minute.")

    monkeypatch.setattr(Blocks, "list", refuse)
    with pytest.raises(MCPError) as raised:
        await client.get_prompt("memory")
    assert raised.value.error.message == "Memory is being moved; try again in a minute."

    monkeypatch.setattr(Blocks, "list", lambda *a, **k: _key_error())
    with caplog.at_level(logging.ERROR, logger="kernmind.boundary"):
        with pytest.raises(MCPError) as raised:
            await client.get_prompt("memory")
    match = INTERNAL.match(raised.value.error.message)
    assert match is not None, raised.value.error.message
    assert "prompt 'memory'" in logged_under(caplog, match.group(1)).getMessage()


async def test_an_unknown_prompt_is_still_the_sdks_answer(client: Client) -> None:
    with pytest.raises(MCPError) as raised:
        await client.get_prompt("no-such-prompt")
    assert "internal error (ref" not in raised.value.error.message


# ------------------------------------------------------------------ one function for calls from inside


async def test_call_tool_from_inside_the_server_gets_the_same_boundary(
    client: Client, server: MCPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = await boundary.call_tool(server, "memory_list", {})
    assert not ok.is_error and ok.structured_content is not None
    assert [b["label"] for b in ok.structured_content["blocks"]] == ["persona", "human"]

    refused = await boundary.call_tool(server, "memory_read", {"label": "nope"})
    assert refused.is_error
    assert refused.content[0].text.startswith("Error executing tool memory_read: There is no memory block")

    strict = await boundary.call_tool(server, "memory_read", {"label": "human", "lable": 1})
    assert strict.is_error and strict.content[0].text.startswith("Invalid arguments for memory_read:")

    monkeypatch.setattr(Blocks, "get", lambda *a, **k: _key_error())
    fault = await boundary.call_tool(server, "memory_read", {"label": "human"})
    assert fault.is_error and INTERNAL.search(fault.content[0].text)


# ------------------------------------------------------------------ the pieces


def test_a_group_of_one_is_its_member_and_a_larger_group_stays() -> None:
    refusal = Refusal("say it")
    assert boundary.leaf(ExceptionGroup("outer", [ExceptionGroup("inner", [refusal])])) is refusal
    two = ExceptionGroup("two", [Refusal("a"), Refusal("b")])
    assert boundary.leaf(two) is two


def test_an_answer_for_a_larger_group_is_an_internal_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="kernmind.boundary"):
        text, missing = boundary.answer(ExceptionGroup("two", [KeyError("a"), KeyError("b")]), "a test")
    assert INTERNAL.match(text) and not missing


def test_only_the_boundary_speaks_the_sdks_error_types() -> None:
    """A part raises its refusal; it never builds a ToolError or ResourceError itself."""
    import ast
    import pathlib

    import kernmind

    src = pathlib.Path(kernmind.__file__).parent
    sdk_errors = {"ToolError", "ResourceError", "ResourceNotFoundError", "UnexpectedToolError"}
    offenders = []
    for path in src.rglob("*.py"):
        if path.name in ("boundary.py", "sdk_compat.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "mcp.server.mcpserver.exceptions":
                offenders += [
                    f"{path.relative_to(src)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name in sdk_errors
                ]
    assert not offenders, "raise a kernmind.refusals.Refusal instead: " + ", ".join(offenders)


# ------------------------------------------------------------------ the boundary is outermost


async def test_a_fault_in_a_hook_before_the_tool_is_answered_in_words(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The strict argument check runs before the SDK's call_tool (a request-handler wrapper): a
    fault there is an internal error result with its ref, not a raw JSON-RPC error."""
    import kernmind.tool_arguments

    monkeypatch.setattr(kernmind.tool_arguments, "check_arguments", lambda *a, **k: _key_error())
    with caplog.at_level(logging.ERROR, logger="kernmind.boundary"):
        text = await call(client, "memory_list")
    match = INTERNAL.search(text)
    assert match and text.startswith("Error executing tool memory_list: "), text
    logged_under(caplog, match.group(1))


def test_a_database_that_cannot_be_reached_is_said_in_words() -> None:
    import psycopg
    import psycopg_pool

    for exc in (
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.OperationalError("connection failed: No such file or directory"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
    ):
        wrapped = RuntimeError("while reading")
        wrapped.__cause__ = exc
        text, missing = boundary.answer(wrapped, "a test")
        assert text.startswith(f"the memory database is unavailable: {exc}"), text
        assert not missing
    # a query's own fault is not about reachability
    assert INTERNAL.match(boundary.answer(psycopg.errors.SyntaxError("bad"), "a test")[0])


# ------------------------------------------------------------------ a database that goes away and comes back


class Database:
    """A PostgreSQL server of this test's own, stopped and started again by the test."""

    def __init__(self) -> None:
        try:
            self.pg = PostgresServer().start()
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot start PostgreSQL here: {getattr(exc, 'stderr', '') or exc}")
        self.url = self.pg.new_database()

    def _pg_ctl(self, *args: str) -> None:
        self.pg._run(str(self.pg.bindir / "pg_ctl"), "-D", str(self.pg.data), *args)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")  # connections end: "terminating connection …"

    def start(self) -> None:
        options = f"-k {self.pg.dir} -p {self.pg.port} -c listen_addresses='' -c fsync=off"
        self._pg_ctl("-o", options, "-l", str(self.pg.dir / "log"), "-w", "start")

    def close(self) -> None:
        """Stop it for good, also when a failing test left it stopped."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg.stop()


@pytest.fixture(scope="module")
def database_deployment(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[HttpServer, dict, Database]]:
    database = Database()
    tmp = tmp_path_factory.mktemp("database-down")
    file = TokenFile(tmp / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    server = start_http(
        tmp,
        *("--tokens", str(file.path), "--db", database.url, "--sandbox", "none"),
        *("--embedding-model", "none", "--preload", "[]"),
    )
    try:
        yield server, tokens, database
    finally:
        server.stop()
        database.close()


CODE_READS = (
    "import kernmind_tools as km\n"
    "try:\n    emit(km.memory_read(label='human')['label'])\n"
    "except km.ToolError as e:\n    emit(str(e))\n"
)


async def test_a_database_that_is_down_is_a_sentence_and_the_server_recovers_by_itself(
    database_deployment: tuple[HttpServer, dict, Database],
) -> None:
    """Over real HTTP, two principals. alice's first memory call (client and code alike) meets a
    PostgreSQL that is down: opening her memory space fails inside the boundary, so each call is
    a tool error result saying the database is unavailable (not a raw JSON-RPC error, not an
    internal error); bob, whose space is open, gets the same sentence. PostgreSQL comes back: the
    next calls of both work, without a restart."""
    server, tokens, database = database_deployment

    def client(who: str) -> Client:
        return http_client(server.url, {"Authorization": f"Bearer {tokens[who]}"}, "auto")

    async with client("alice") as alice, client("bob") as bob:
        structured(await bob.call_tool("memory_list", {}))  # bob's space is open
        await run_emitting(alice, "x = 1", session_id="work")  # alice has a kernel, no memory yet
        database.stop()
        try:
            for who, c in (("alice", alice), ("bob", bob)):
                text = error_text(await c.call_tool("memory_read", {"label": "human"}))
                assert text.startswith(
                    "Error executing tool memory_read: the memory database is unavailable: "
                )
                (said,) = await run_emitting(c, CODE_READS, session_id="work")
                assert said.startswith(
                    "Error executing tool memory_read: the memory database is unavailable"
                ), (who, said)
                with pytest.raises(MCPError) as raised:  # a resource read: the same sentence
                    await c.read_resource("memory://blocks")
                assert raised.value.error.message.startswith("the memory database is unavailable: ")
            assert server.proc.poll() is None
        finally:
            database.start()
        for c in (alice, bob):
            assert structured(await c.call_tool("memory_read", {"label": "human"}))["label"] == "human"
            assert await run_emitting(c, CODE_READS, session_id="work") == ["human"]


async def test_a_server_started_while_its_database_is_down_serves_and_recovers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The memory database opens in the background, so a server whose PostgreSQL is down at start
    still answers the handshake and runs code; each memory call says at once that the database is
    unavailable (no pool left retrying per call), and works once PostgreSQL is back, no restart."""
    database = Database()
    try:
        database.stop()
        tmp = tmp_path_factory.mktemp("started-while-down")
        settings = make_settings(tmp, db=database.url, sandbox="none", embedding_model="none")
        async with Client(create_server(settings)) as client:
            assert await run_emitting(client, "emit(6 * 7)") == [42]
            for _ in range(2):
                with anyio.fail_after(15):  # at once, not after the pool's 30 s
                    text = error_text(await client.call_tool("memory_read", {"label": "human"}))
                assert text.startswith(
                    "Error executing tool memory_read: the memory database is unavailable: "
                )
            database.start()
            assert structured(await client.call_tool("memory_read", {"label": "human"}))["label"] == "human"
    finally:
        database.close()


async def test_a_memory_database_that_cannot_be_opened_is_a_sentence_and_code_still_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``--db`` names a file that cannot be made: the server starts, code runs, and every memory
    call says in words that memory cannot be opened and what to check (no internal error)."""
    tmp = tmp_path_factory.mktemp("bad-db")
    blocker = tmp / "not-a-directory"
    blocker.write_text("a file where the database's directory should be")
    settings = make_settings(tmp, db=blocker / "kernmind.db", sandbox="none", embedding_model="none")
    async with Client(create_server(settings)) as client:
        for _ in range(2):
            text = error_text(await client.call_tool("memory_read", {"label": "human"}))
            assert text.startswith("Error executing tool memory_read: Memory cannot be opened: "), text
            assert "check --db" in text and "internal error" not in text
        assert await run_emitting(client, "emit(6 * 7)") == [42]


async def test_the_first_call_after_the_database_restarted_unseen_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL restarts while nobody calls: the pooled connections died with it, and the next
    read is given a working one (a connection idle for a while is checked before use)."""
    from kernmind.memory import postgres

    monkeypatch.setattr(postgres, "CHECK_IDLE", 0.0)  # every connection counts as idle
    database = Database()
    try:
        db = await postgres.PostgresDatabase(database.url).open()
        try:
            for _ in range(2):
                async with db.read() as tx:
                    await tx.conn.execute("SELECT 1")
            database.stop()
            database.start()
            async with db.read() as tx:
                assert await (await tx.conn.execute("SELECT 41 + 1")).fetchone() == (42,)
        finally:
            await db.close()
    finally:
        database.close()


async def test_the_first_call_after_a_long_outage_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """While PostgreSQL is down each call fails at once (not after the pool's 30 s), and the first
    call after it is back works, however far the pool's own reconnection has backed off (made 60 s
    here, as after a long outage: the pool alone would make that call wait 30 s and fail)."""
    import psycopg
    import psycopg_pool.base

    from kernmind.memory import postgres

    monkeypatch.setattr(psycopg_pool.base.AttemptWithBackoff, "INITIAL_DELAY", 60.0)
    database = Database()
    try:
        db = await postgres.PostgresDatabase(database.url).open()
        try:

            async def one() -> Any:
                async with db.read() as tx:
                    return await (await tx.conn.execute("SELECT 41 + 1")).fetchone()

            assert await one() == (42,)
            database.stop()
            for _ in range(3):
                with pytest.raises(psycopg.OperationalError) as down:
                    await one()
                assert not isinstance(down.value, psycopg_pool.PoolTimeout)  # said at once, not waited out
            database.start()
            assert await one() == (42,)
            assert await one() == (42,)
        finally:
            await db.close()
    finally:
        database.close()

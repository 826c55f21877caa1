"""run_code for JavaScript, TypeScript, R, Java and bash, driven through the real MCP server.

One server per module (the language runners are stateless per call; Java's warm host is
shared by the calls of the default session, which is what keeps this module fast). Every
language gets the same checks: hello world, the last expression's value, a runtime error,
a syntax error, stdout and stderr together, unicode, and a timeout that leaves no process
behind. Letta's documented examples are checked as documented.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp
import pytest

from kernmind.config import Settings
from kernmind.execution import runners as runners_mod
from kernmind.execution.results import RunResult
from kernmind.server import create_server

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("languages"), pytest.mark.slow]

LANGS = ("javascript", "typescript", "r", "java", "bash")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("languages")


@pytest.fixture(scope="module")
async def client(data_dir: Path, anyio_backend: str) -> AsyncIterator[mcp.Client]:
    settings = Settings(data_dir=data_dir, pool_size=0, timeout=60, memory_mb=1024)
    async with mcp.Client(create_server(settings)) as c:
        yield c


async def run(client: mcp.Client, code: str, language: str, **kw: Any) -> dict[str, Any]:
    result = await client.call_tool("run_code", {"code": code, "language": language, **kw})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def stdout(res: dict[str, Any]) -> str:
    return "".join(res["logs"]["stdout"])


def stderr(res: dict[str, Any]) -> str:
    return "".join(res["logs"]["stderr"])


def value(res: dict[str, Any]) -> str | None:
    mains = [r["text"] for r in res["results"] if r.get("is_main_result")]
    return mains[-1] if mains else None


def processes_matching(needle: str) -> list[str]:
    """Live (non-zombie) processes whose command line contains ``needle``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


async def wait_gone(needle: str, within: float = 5.0) -> list[str]:
    for _ in range(int(within * 10)):  # polling /proc: there is no event to wait on
        if not processes_matching(needle):
            return []
        await anyio.sleep(0.1)
    return processes_matching(needle)


# --- the same checks for every language ---------------------------------------------------
HELLO = {
    "javascript": 'console.log("hello world")',
    "typescript": 'const who: string = "world";\nconsole.log(`hello ${who}`)',
    "r": 'cat("hello world\\n")',
    "java": 'System.out.println("hello world");',
    "bash": "echo hello world",
}
LAST_VALUE = {
    "javascript": ("const xs = [1, 2, 3];\nxs.map((x) => x * 2)\n  .reduce((a, b) => a + b, 0)", "12"),
    "typescript": ("function sq(n: number): number {\n  return n * n;\n}\nsq(7)", "49"),
    "r": ("x <- c(1, 2, 3)\nsum(x) * 2", "[1] 12"),
    "java": ("int a = 6;\na * 7", "42"),
}
RUNTIME_ERROR = {
    "javascript": ('function f() { throw new TypeError("bad value") }\nf()', "TypeError", "bad value"),
    "typescript": ("const o: any = null;\no.field", "TypeError", "null"),
    "r": ('f <- function() stop("boom")\nf()', "Error", "boom"),
    "java": ("int[] a = new int[2];\na[5] = 1;", "java.lang.ArrayIndexOutOfBoundsException", "5"),
    "bash": ("echo before; false; exit 3", "NonZeroExit", "3"),
}
SYNTAX_ERROR = {
    "javascript": "const x = ;",
    "typescript": "let y: number = (1 + ;",
    "r": "x <- (1 + ",
    "java": "int z = ;",
    "bash": "if then fi",
}
BOTH_STREAMS = {
    "javascript": 'console.log("to out"); console.error("to err")',
    "typescript": 'console.log("to out"); console.error("to err")',
    "r": 'cat("to out\\n"); message("to err")',
    "java": 'System.out.println("to out"); System.err.println("to err");',
    "bash": "echo to out; echo to err >&2",
}
UNICODE = {
    "javascript": 'console.log("héllo wörld ✓ 日本")',
    "typescript": 'console.log("héllo wörld ✓ 日本")',
    "r": 'cat("héllo wörld ✓ 日本\\n")',
    "java": 'System.out.println("héllo wörld ✓ 日本");',
    "bash": "echo 'héllo wörld ✓ 日本'",
}


async def test_schema_lists_installed_languages(client: mcp.Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    enum = tools["run_code"].input_schema["properties"]["language"]["enum"]
    for lang in LANGS:
        assert lang in enum


@pytest.mark.parametrize("lang", LANGS)
async def test_hello_world(client: mcp.Client, lang: str) -> None:
    res = await run(client, HELLO[lang], lang)
    assert res["status"] == "ok", res
    assert res["language"] == lang
    assert stdout(res) == "hello world\n"
    assert res["error"] is None  # the contract keeps error (null) in every result
    assert res["files"] == []


@pytest.mark.parametrize("lang", sorted(LAST_VALUE))
async def test_last_expression_value(client: mcp.Client, lang: str) -> None:
    code, expected = LAST_VALUE[lang]
    res = await run(client, code, lang)
    assert res["status"] == "ok", res
    assert value(res) == expected
    assert expected not in stdout(res)


@pytest.mark.parametrize("lang", LANGS)
async def test_runtime_error(client: mcp.Client, lang: str) -> None:
    code, name, fragment = RUNTIME_ERROR[lang]
    res = await run(client, code, lang)
    assert res["status"] == "error", res
    assert res["error"]["name"] == name
    assert fragment in res["error"]["value"]
    assert "\x1b[" not in res["error"]["traceback"]
    if lang == "bash":
        assert stdout(res) == "before\n"


@pytest.mark.parametrize("lang", LANGS)
async def test_syntax_error(client: mcp.Client, lang: str) -> None:
    res = await run(client, SYNTAX_ERROR[lang], lang)
    assert res["status"] == "error", res
    assert res["error"]["name"] == "SyntaxError", res.get("error")
    assert res["error"]["value"]
    assert ".km-" not in res["error"]["traceback"]


@pytest.mark.parametrize("lang", LANGS)
async def test_stdout_and_stderr(client: mcp.Client, lang: str) -> None:
    res = await run(client, BOTH_STREAMS[lang], lang)
    assert res["status"] == "ok", res
    assert stdout(res) == "to out\n"
    assert stderr(res) == "to err\n"


@pytest.mark.parametrize("lang", LANGS)
async def test_unicode(client: mcp.Client, lang: str) -> None:
    res = await run(client, UNICODE[lang], lang)
    assert res["status"] == "ok", res
    assert stdout(res) == "héllo wörld ✓ 日本\n"


TIMEOUT_CODE = {
    # Languages that may start processes leave a child sleeping with a unique argument.
    "javascript": "while (true) {}",
    "typescript": "let n: number = 0;\nwhile (true) { n++; }",
    "r": 'system("sleep {mark} &")\nrepeat {}',
    "java": 'new ProcessBuilder("sleep", "{mark}").start();\nwhile (true) { }',
    "bash": "sleep {mark} &\n( sleep {mark} ) &\nwhile :; do :; done",
}


@pytest.mark.parametrize("lang", LANGS)
async def test_timeout_kills_everything(client: mcp.Client, lang: str) -> None:
    mark = f"{1000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    code = TIMEOUT_CODE[lang].replace("{mark}", mark)
    with anyio.fail_after(120):  # a hang bound only: the 1.5 s limit's end is the status below
        res = await run(client, code, lang, timeout=1.5)
    assert res["status"] == "timeout", res
    assert res["error"]["name"] == "TimeoutError"
    assert await wait_gone(mark) == []
    if lang in ("javascript", "typescript"):  # Deno may not start processes: no deno left either
        assert await wait_gone("deno run") == []
    # And the language works again right after.
    again = await run(client, HELLO[lang], lang)
    assert again["status"] == "ok", again


async def test_output_budget(client: mcp.Client) -> None:
    res = await run(client, "for i in $(seq 1 20000); do echo line $i; done", "bash")
    assert res["status"] == "ok"
    assert res["truncated"] is True
    out = stdout(res)
    assert len(out) < 60_000
    assert "line 1\n" in out and "line 20000\n" in out


async def test_files_are_listed_and_shared(client: mcp.Client) -> None:
    res = await run(client, "printf 'a,b\\n1,2\\n' > shared.csv", "bash")
    assert [f["path"] for f in res["files"]] == ["shared.csv"]
    res = await run(
        client, 'const fs = require("fs");\nfs.readFileSync("shared.csv", "utf8").length', "javascript"
    )
    assert value(res) == "8", res
    res = await run(client, 'nrow(read.csv("shared.csv"))', "r")
    assert value(res) == "[1] 1", res


# --- Letta's documented examples ----------------------------------------------------------------
async def test_letta_js_require_fs_works(client: mcp.Client) -> None:
    code = 'const fs = require("fs");\nfs.writeFileSync("note.txt", "hi");\nconsole.log(fs.readFileSync("note.txt", "utf8"));'
    res = await run(client, code, "javascript")
    assert res["status"] == "ok", res
    assert stdout(res) == "hi\n"
    assert any(f["path"] == "note.txt" for f in res["files"])


async def test_node_prefixed_imports_and_require_mix(client: mcp.Client) -> None:
    code = (
        'import path from "node:path";\nconst os = require("node:os");\npath.join("a", "b") + typeof os.cpus'
    )
    res = await run(client, code, "typescript")
    assert res["status"] == "ok", res
    assert value(res) == "'a/bfunction'"


async def test_letta_js_require_axios_fails_cleanly(client: mcp.Client) -> None:
    res = await run(client, 'const axios = require("axios");\naxios.get("https://example.com")', "javascript")
    assert res["status"] == "error"
    assert "Cannot find module 'axios'" in res["error"]["value"]
    assert "not installed" in res["error"]["value"]
    res = await run(client, 'import axios from "npm:axios";', "javascript")
    assert res["status"] == "error"
    assert res["error"]["name"] == "ModuleNotFoundError"


async def test_letta_r_mean(client: mcp.Client) -> None:
    res = await run(client, "mean(c(1, 2, 3))", "r")
    assert res["status"] == "ok", res
    assert value(res) == "[1] 2"


async def test_letta_java_example(client: mcp.Client) -> None:
    res = await run(client, "int x = 42; System.out.println(x);", "java")
    assert res["status"] == "ok", res
    assert stdout(res) == "42\n"


async def test_java_calls_do_not_share_state(client: mcp.Client) -> None:
    res = await run(client, 'int leaked = 7;\nSystem.setProperty("km.leak", "yes");', "java")
    assert res["status"] == "ok", res
    res = await run(client, "leaked", "java")
    assert res["status"] == "error"
    assert "cannot find symbol" in res["error"]["value"]
    res = await run(client, 'System.getProperty("km.leak")', "java")
    assert value(res) == "null"


JVM_PID = "java.lang.management.ManagementFactory.getRuntimeMXBean().getStartTime()"  # one per JVM


async def test_a_java_host_that_must_go_is_replaced_and_says_why(client: mcp.Client) -> None:
    """System.exit, threads left running: the call says so, its JVM goes, the next one gets a new
    JVM (these used to fail as an internal error: the host could not be set aside to stop)."""
    sid = "java-hosts"
    first = value(await run(client, JVM_PID, "java", session_id=sid))
    res = await run(client, "System.exit(0);", "java", session_id=sid)
    assert res["status"] == "ok" and "the code called System.exit(0); its JVM ended." in res["notes"], res
    second = value(await run(client, JVM_PID, "java", session_id=sid))
    assert second is not None and second != first
    # (A thread that sleeps, not one that spins: a spinning one starved the JVM's own work past the
    # 60 s limit once on a loaded machine, and what is tested is that it is left running.)
    forever = "new Thread(() -> { while (true) { try { Thread.sleep(100); } catch (InterruptedException e) {} } }).start();"
    res = await run(client, forever, "java", session_id=sid)
    assert "the code left threads running; they were stopped with its JVM." in res["notes"], res
    third = value(await run(client, JVM_PID, "java", session_id=sid))
    assert third is not None and third != second


async def test_java_in_stateless_mode_gets_a_jvm_per_call(tmp_path: Path) -> None:
    async with mcp.Client(create_server(Settings(data_dir=tmp_path, pool_size=0, stateless=True))) as c:
        pids = [value(await run(c, JVM_PID, "java")) for _ in range(2)]
    assert None not in pids and pids[0] != pids[1]


async def test_javascript_network_is_off(client: mcp.Client) -> None:
    res = await run(client, 'await fetch("http://example.com")', "javascript")
    assert res["status"] == "error"
    assert "net" in res["error"]["value"].lower()


async def test_promise_values_are_awaited(client: mcp.Client) -> None:
    res = await run(client, "async function f() { return { answer: 42 } }\nf()", "javascript")
    assert value(res) == "{ answer: 42 }"


async def test_r_plots_come_back_as_images(client: mcp.Client) -> None:
    """Base R graphics become PNG results and MCP image content, not an Rplots.pdf file."""
    result = await client.call_tool(
        "run_code", {"code": "plot(1:10)\nhist(c(1, 2, 2, 3))\nmean(c(1, 2, 3))", "language": "r"}
    )
    res = result.structured_content
    assert res is not None and res["status"] == "ok"
    images = [b for b in result.content if b.type == "image"]
    assert len(images) == 2
    assert all(base64.b64decode(b.data).startswith(b"\x89PNG") for b in images)
    assert [r["image"]["content_index"] for r in res["results"] if r.get("image")] == [1, 2]
    assert res["results"][-1]["text"] == "[1] 2"
    assert not any(f["path"].endswith(".pdf") or ".km-" in f["path"] for f in res["files"])


async def test_no_value_for_statements(client: mcp.Client) -> None:
    for lang, code in [("javascript", "let a = 1;"), ("r", "a <- 1"), ("java", "int a = 1;")]:
        res = await run(client, code, lang)
        assert res["status"] == "ok", res
        assert res["results"] == [], (lang, res)


# --- missing runtimes and shutdown ---------------------------------------------------------------
async def test_missing_runtime_is_left_out_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(runners_mod._probe_cache, "r", runners_mod.r.INSTALL_HINT)
    server = create_server(Settings(data_dir=tmp_path, pool_size=0))
    async with mcp.Client(server) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        enum = tools["run_code"].input_schema["properties"]["language"]["enum"]
        assert "r" not in enum and "bash" in enum
        result = await c.call_tool("run_code", {"code": "1", "language": "r"})
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert "r-base-core" in text


async def test_warm_java_host_stops_with_the_server(tmp_path: Path) -> None:
    async with mcp.Client(create_server(Settings(data_dir=tmp_path, pool_size=0))) as c:
        res = await run(c, "1 + 2", "java")
        assert value(res) == "3"
        assert processes_matching(str(tmp_path)) != []  # the warm host is alive between calls
    assert await wait_gone(str(tmp_path)) == []


async def test_small_memory_limit_still_runs_deno_and_java(tmp_path: Path) -> None:
    """V8 needs --jitless and the JVM explicit sizes under a 512 MiB RLIMIT_DATA."""
    from kernmind.execution.results import OutputCollector
    from kernmind.execution.runners.base import Call
    from kernmind.execution.sandbox.bwrap import Sandbox
    from kernmind.execution.sandbox.rlimits import limits_from
    from kernmind.execution.sandbox.workspace import Workspace
    from kernmind.execution.sessions.session import Session
    from kernmind.execution.supervisor import supervise

    settings = Settings(data_dir=tmp_path, pool_size=0, memory_mb=512)
    sandbox = Sandbox.detect("auto", limits=limits_from(settings))
    runners = runners_mod.discover(sandbox, settings)
    ws = Workspace(tmp_path / "ws", owner_uid=sandbox.allocate_uid())
    ws.create()
    session = Session("small", new_workspace=lambda: ws)

    async def run_in(language: str, code: str, timeout: float) -> RunResult:
        call = Call(code=code, session=session, collector=OutputCollector(50_000), timeout=timeout)
        return await supervise(runners[language], call, quota_bytes=0)

    try:
        res = await run_in("javascript", "[1, 2, 3].length", 30)
        assert res.status == "ok" and res.results[0].text == "3", res
        res = await run_in("java", "long[] big = new long[400_000_000];", 60)
        assert res.status == "error" and res.error is not None
        assert res.error.name == "java.lang.OutOfMemoryError", res.error
    finally:
        for runner in runners.values():
            await runner.aclose()

"""run_code for Python, driven through a real in-process server (mcp.Client).

One server is shared by the module; each test uses its own session ids so they don't
interfere. What each test proves is in its name and docstring.

Every test that uses ``client`` runs twice: on local sandboxed kernels, and on kernels of a
real Jupyter Kernel Gateway with sessions in a real PostgreSQL (``--kernel-gateway``, the
cluster shape). A test of something the gateway does not change is marked ``local_only``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured
from tests.execution.conftest import gateway_settings

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("python"), pytest.mark.slow]


@pytest.fixture(
    scope="module",
    # The gateway's half in a group of its own, so the two halves can run on different workers.
    params=["local", pytest.param("gateway", marks=pytest.mark.xdist_group("python-gateway"))],
)
async def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    data = tmp_path_factory.mktemp("py")
    if request.param == "gateway":
        gateway, postgres = (
            request.getfixturevalue("kernel_gateway"),
            request.getfixturevalue("postgres_server"),
        )
        settings = gateway_settings(data, gateway, postgres, pool_size=2, max_sessions=64)
    else:
        settings = make_settings(data, pool_size=2, max_sessions=64)
    async with Client(create_server(settings)) as c:
        yield c


@pytest.fixture(autouse=True)
def _only_where_it_matters(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("local_only")
    callspec = getattr(request.node, "callspec", None)
    if marker is not None and callspec is not None and callspec.params.get("client") == "gateway":
        pytest.skip(f"the same on every backend: {marker.args[0]}")


local_only = pytest.mark.local_only


async def run(client: Client, code: str, **kw: object) -> dict:
    return structured(await client.call_tool("run_code", {"code": code, **kw}))


async def run_telling_start(client: Client, code: str, started: anyio.Event, **kw: object) -> dict:
    """``run``, setting ``started`` at the call's first progress notification (sent about a second
    after its code began): a test waits on that, not on a time. Set at the end too, so nothing hangs."""

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    try:
        return structured(
            await client.call_tool("run_code", {"code": code, **kw}, progress_callback=on_progress)
        )
    finally:
        started.set()


# --- sessions and state -------------------------------------------------------


async def test_state_persists_within_a_session(client: Client) -> None:
    await run(client, "import math\nvalue = 41", session_id="persist")
    out = await run(client, "value + 1, math.pi > 3", session_id="persist")
    assert out["status"] == "ok"
    assert out["results"][0]["text"] == "(42, True)"
    assert out["session_id"] == "persist"


async def test_sessions_are_independent(client: Client) -> None:
    await run(client, "secret = 'a'", session_id="iso-a")
    out = await run(client, "secret", session_id="iso-b")
    assert out["status"] == "error"
    assert out["error"]["name"] == "NameError"


async def test_calls_without_session_share_the_default_session(client: Client) -> None:
    await run(client, "shared_default = 7")
    out = await run(client, "shared_default * 6")
    assert out["results"][0]["text"] == "42"
    assert out["session_id"] == "default-mcp"  # this client's default (clientInfo name "mcp")


async def test_reset_gives_a_fresh_interpreter_but_keeps_files(client: Client) -> None:
    await run(client, "import json\nx = 1\nopen('keep.txt', 'w').write('kept')", session_id="reset-me")
    out = await run(
        client,
        "'x' in globals(), 'json' in globals(), open('keep.txt').read()",
        session_id="reset-me",
        reset=True,
    )
    assert out["status"] == "ok"
    assert out["results"][0]["text"] == "(False, False, 'kept')"


async def test_working_directory_persists_and_result_lists_new_files(client: Client) -> None:
    out = await run(
        client,
        "import os\nos.makedirs('sub', exist_ok=True)\nopen('sub/a.csv','w').write('1,2\\n')",
        session_id="files",
    )
    assert [f["path"] for f in out["files"]] == ["sub/a.csv"]
    assert out["files"][0]["mime"] == "text/csv"
    out = await run(client, "open('sub/a.csv').read()", session_id="files")
    assert out["files"] == []  # nothing changed in this call
    assert out["results"][0]["text"] == "'1,2\\n'"


async def test_execution_count_increases(client: Client) -> None:
    first = await run(client, "1", session_id="counter")
    second = await run(client, "2", session_id="counter")
    assert second["execution_count"] == first["execution_count"] + 1


async def test_calls_to_one_session_run_in_order(client: Client, request: pytest.FixtureRequest) -> None:
    """A second call queued behind a slow one sees its effect (shared sessions; local ones on fake
    kernels: ``test_calls_on_fakes.py``)."""
    if request.node.callspec.params["client"] == "local":
        pytest.skip("the registry's logic: tests/execution/test_calls_on_fakes.py")
    results: dict[str, dict] = {}
    started = anyio.Event()

    async def slow() -> None:
        code = "import time\ntime.sleep(3)\norder = ['slow']"
        results["slow"] = await run_telling_start(client, code, started, session_id="ordered")

    async def fast() -> None:
        await started.wait()  # the slow call is running: this one queues behind it
        results["fast"] = await run(client, "order.append('fast'); order", session_id="ordered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        tg.start_soon(fast)
    assert results["fast"]["results"][0]["text"] == "['slow', 'fast']"


async def test_different_sessions_run_in_parallel(client: Client, request: pytest.FixtureRequest) -> None:
    """A quick call in session B finishes while a slow call in session A is still running (shared
    sessions; local ones on fake kernels: ``test_calls_on_fakes.py``)."""
    if request.node.callspec.params["client"] == "local":
        pytest.skip("the registry's logic: tests/execution/test_calls_on_fakes.py")
    finished: list[str] = []
    await run(client, "1", session_id="par-a")
    await run(client, "1", session_id="par-b")
    started = anyio.Event()

    async def slow() -> None:  # 300 s: it is still running when B's call ends, however slow the machine
        await run_telling_start(client, "import time; time.sleep(300)", started, session_id="par-a")
        finished.append("a")

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        await started.wait()
        await run(client, "2 + 2", session_id="par-b")
        finished.append("b")
        tg.cancel_scope.cancel()  # A's call, cancelled by its client, interrupts its kernel
    assert finished == ["b"]


async def test_list_and_close_sessions(client: Client) -> None:
    await run(client, "1", session_id="to-close")
    listed = structured(await client.call_tool("list_sessions", {}))
    assert "to-close" in [s["session_id"] for s in listed["sessions"]]
    closed = structured(await client.call_tool("close_session", {"session_id": "to-close"}))
    assert closed["closed"] is True
    listed = structured(await client.call_tool("list_sessions", {}))
    assert "to-close" not in [s["session_id"] for s in listed["sessions"]]
    msg = error_text(await client.call_tool("close_session", {"session_id": "to-close"}))
    assert "no session named" in msg


# --- results ----------------------------------------------------------------------


async def test_stdout_stderr_and_last_expression(client: Client) -> None:
    out = await run(
        client, "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n6 * 7", session_id="streams"
    )
    assert "".join(out["logs"]["stdout"]) == "hello\n"
    assert "".join(out["logs"]["stderr"]) == "warn\n"
    assert out["results"][0]["text"] == "42"
    assert out["results"][0]["is_main_result"] is True
    assert out["duration_ms"] > 0


async def test_error_shape_has_name_value_and_plain_traceback(client: Client) -> None:
    out = await run(client, "def f():\n    return 1/0\nf()", session_id="errors")
    assert out["status"] == "error"
    err = out["error"]
    assert err["name"] == "ZeroDivisionError"
    assert err["value"] == "division by zero"
    assert "return 1/0" in err["traceback"]
    assert "\x1b[" not in err["traceback"]


async def test_matplotlib_plot_returns_png_image_content_without_show(client: Client) -> None:
    result = await client.call_tool(
        "run_code", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])", "session_id": "plot"}
    )
    out = structured(result)
    images = [b for b in result.content if b.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
    # The image travels once: the structured result points at its content block.
    refs = [r["image"] for r in out["results"] if r.get("image")]
    assert refs == [
        {"content_index": 1, "mime_type": "image/png", "bytes": len(base64.b64decode(images[0].data))}
    ]
    assert all("png" not in r for r in out["results"])  # no null fields either


async def test_rich_mime_types_are_passed_through(client: Client) -> None:
    code = (
        "from IPython.display import display, HTML, Markdown, Latex, JSON, SVG\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(Markdown('# title'))\n"
        "display(Latex(r'$x^2$'))\n"
        "display(JSON({'a': 1}))\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>\'))\n'
    )
    out = await run(client, code, session_id="rich")
    by_kind = {
        k: r[k] for r in out["results"] for k in ("html", "markdown", "latex", "json", "svg") if r.get(k)
    }
    assert by_kind["html"] == "<b>bold</b>"
    assert by_kind["markdown"] == "# title"
    assert by_kind["latex"] == "$x^2$"
    assert by_kind["json"] == {"a": 1}
    assert by_kind["svg"].startswith("<svg")
    assert all(r["text"] for r in out["results"])  # text/plain is always there


async def test_huge_output_is_truncated_head_and_tail(client: Client) -> None:
    out = await run(client, "for i in range(200_000): print(i)", session_id="huge")
    assert out["truncated"] is True
    stdout = "".join(out["logs"]["stdout"])
    assert stdout.startswith("0\n1\n2\n")
    assert stdout.rstrip().endswith("199999")
    assert "output truncated" in stdout
    assert len(stdout) < 60_000


async def test_hundred_megabytes_of_output_does_not_break_the_server(client: Client) -> None:
    """The kernel caps what it sends; the marker still counts every dropped character."""
    code = "import sys\nfor _ in range(100): sys.stdout.write('y' * 1_000_000)\nprint('END')"
    out = await run(client, code, session_id="flood")
    assert out["truncated"] is True
    stdout = "".join(out["logs"]["stdout"])
    assert len(stdout) < 60_000
    assert stdout.endswith("END\n")
    assert int(stdout.split("output truncated: ")[1].split(" ")[0]) >= 99_000_000
    again = await run(client, "'still here'", session_id="flood")
    assert again["results"][0]["text"] == "'still here'"


async def test_clear_output_leaves_only_what_follows_and_gives_the_budget_back(client: Client) -> None:
    """``clear_output()`` drops what the cell printed and displayed before it, on both streams,
    and what it dropped no longer counts: 300,000 characters (past the server's budget of
    50,000 and the kernel's own cap) then 30,000 more would be truncated without it."""
    code = (
        "import sys\n"
        "from IPython.display import clear_output, display\n"
        "print('x' * 300_000)\n"
        "sys.stderr.write('a warning\\n')\n"
        "display({'text/plain': 'old figure'}, raw=True)\n"
        "clear_output()\n"
        "print('y' * 30_000)\n"
        "print('done')\n"
        "'last'"
    )
    out = await run(client, code, session_id="clear")
    assert out["status"] == "ok"
    assert "".join(out["logs"]["stdout"]) == "y" * 30_000 + "\ndone\n"
    assert out["logs"]["stderr"] == []
    assert [r["text"] for r in out["results"]] == ["'last'"]
    assert out["truncated"] is False


async def test_clear_output_wait_keeps_the_last_frame(client: Client) -> None:
    """A progress display that redraws itself (``wait=True``) shows its last frame only."""
    code = (
        "from IPython.display import clear_output\n"
        "for i in range(50):\n"
        "    clear_output(wait=True)\n"
        "    print(f'step {i}', 'x' * 5_000)\n"
    )
    out = await run(client, code, session_id="clear-wait")
    assert "".join(out["logs"]["stdout"]) == "step 49 " + "x" * 5_000 + "\n"
    assert out["truncated"] is False


async def test_input_fails_fast_with_a_clear_error(client: Client) -> None:
    with anyio.fail_after(60):  # a hang bound only; the error below shows it did not wait
        out = await run(client, "input('name? ')", session_id="stdin")
    assert out["status"] == "error"
    assert out["error"]["name"] == "StdinNotImplementedError"


# --- time limits, cancellation, crashes -------------------------------------------


async def test_busy_loop_times_out_and_session_keeps_working(client: Client) -> None:
    await run(client, "before = 'kept'", session_id="spin")
    with anyio.fail_after(120):  # a hang bound only: the time limit's end is asserted by the status
        out = await run(client, "while True: pass", session_id="spin", timeout=2)
    assert out["status"] == "timeout"
    assert out["state_preserved"] is True
    after = await run(client, "before", session_id="spin")
    assert after["results"][0]["text"] == "'kept'"


async def test_sleeping_loop_is_interrupted_with_state_preserved(client: Client) -> None:
    out = await run(
        client,
        "import time\ncount = 0\nwhile True:\n    count += 1\n    time.sleep(0.05)",
        session_id="sleepy",
        timeout=1.5,
    )
    assert out["status"] == "timeout"
    assert out["state_preserved"] is True
    after = await run(client, "count > 0", session_id="sleepy")
    assert after["results"][0]["text"] == "True"


async def test_code_that_ignores_interrupts_gets_a_fresh_interpreter(client: Client) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"
    await run(client, "open('survivor.txt','w').write('yes')\nlost = 1", session_id="stubborn")
    out = await run(client, code, session_id="stubborn", timeout=1)
    assert out["status"] == "timeout"
    assert out["state_preserved"] is False
    after = await run(client, "open('survivor.txt').read(), 'lost' in globals()", session_id="stubborn")
    assert after["results"][0]["text"] == "('yes', False)"
    assert any("restarted" in n for n in after["notes"])


async def test_kernel_death_gives_an_error_and_the_next_call_recovers(client: Client) -> None:
    await run(client, "x = 5", session_id="dies")
    out = await run(client, "import os\nos._exit(1)", session_id="dies")
    assert out["status"] == "error"
    assert out["error"]["name"] == "KernelDied"
    assert out["state_preserved"] is False
    after = await run(client, "'x' in globals()", session_id="dies")
    assert after["status"] == "ok"
    assert after["results"][0]["text"] == "False"
    assert any("variables" in n for n in after["notes"])


async def test_segfault_is_reported_as_kernel_death(client: Client) -> None:
    out = await run(client, "import ctypes\nctypes.string_at(0)", session_id="segv")
    assert out["error"]["name"] == "KernelDied"
    after = await run(client, "1 + 1", session_id="segv")
    assert after["results"][0]["text"] == "2"


async def test_client_cancellation_interrupts_the_kernel(client: Client) -> None:
    await run(client, "progress_marker = 'untouched'", session_id="cancel")
    with anyio.CancelScope() as scope:

        async def cancel_once_running(progress: float, total: float | None, message: str | None) -> None:
            scope.cancel()

        code = "import time\nwhile True: time.sleep(0.05)"  # with a 600 s limit: only an interrupt ends it
        await client.call_tool(
            "run_code",
            {"code": code, "session_id": "cancel", "timeout": 600},
            progress_callback=cancel_once_running,
        )
    assert scope.cancelled_caught
    with anyio.fail_after(120):  # not interrupted, this call would queue behind the loop for 600 s
        after = await run(client, "progress_marker", session_id="cancel")
    assert after["results"][0]["text"] == "'untouched'"


async def test_progress_notifications_carry_the_latest_output_line(client: Client) -> None:
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    code = "import time\nfor i in range(5):\n    print(f'step {i}', flush=True)\n    time.sleep(0.6)"
    result = await client.call_tool(
        "run_code", {"code": code, "session_id": "progress"}, progress_callback=on_progress
    )
    assert structured(result)["status"] == "ok"
    assert messages, "no progress notification for a 3 s call"
    assert any(m and m.startswith("step ") for m in messages)


# --- bad arguments ----------------------------------------------------------------


@local_only("argument checks come before any kernel")
async def test_unknown_language_is_a_tool_error(client: Client) -> None:
    msg = error_text(await client.call_tool("run_code", {"code": "1", "language": "cobol"}))
    assert "cobol" in msg and "python" in msg


@local_only("argument checks come before any kernel")
async def test_negative_timeout_is_a_tool_error(client: Client) -> None:
    msg = error_text(await client.call_tool("run_code", {"code": "1", "timeout": -3}))
    assert "timeout" in msg


@local_only("argument checks come before any kernel")
async def test_missing_code_is_a_tool_error(client: Client) -> None:
    msg = error_text(await client.call_tool("run_code", {"language": "python"}))
    assert "code" in msg


@local_only("argument checks come before any kernel")
async def test_invalid_session_id_is_a_tool_error(client: Client) -> None:
    msg = error_text(await client.call_tool("run_code", {"code": "1", "session_id": "../etc"}))
    assert "session_id" in msg


@local_only("argument checks come before any kernel")
async def test_output_schema_is_published(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    schema = tools["run_code"].output_schema
    assert schema is not None
    assert {"status", "results", "logs", "error", "files", "truncated"} <= set(schema["properties"])
    assert tools["run_code"].input_schema["properties"]["language"]["enum"][0] == "python"


# --- server-level options (own servers; caps, time limits and --stateless: test_calls_on_fakes.py) ---


async def test_idle_sessions_are_unloaded_keeping_files_and_variables(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, idle_timeout=1.0, pool_size=0))) as c:
        await run(c, "z = 1\nopen('kept.txt', 'w').write('x')", session_id="idle")
        for _ in range(100):  # the reaper runs every 0.5 s here
            listed = structured(await c.call_tool("list_sessions", {}))
            if [s["state"] for s in listed["sessions"]] == ["stored"]:
                break
            await anyio.sleep(0.1)
        assert [(s["session_id"], s["state"], s["kernel_running"]) for s in listed["sessions"]] == [
            ("idle", "stored", False)
        ]
        out = await run(c, "z, open('kept.txt').read()", session_id="idle")
        assert out["results"][0]["text"] == "(1, 'x')"
        assert any("resumed stored session 'idle'" in n for n in out["notes"])
        assert any("variables restored" in n and "z" in n for n in out["notes"])


async def test_closing_a_session_under_a_queued_call_gives_that_call_a_fresh_session(
    client: Client, request: pytest.FixtureRequest
) -> None:
    """A call waiting for a session that gets closed runs on a new session instead of a dead one
    (shared sessions' close; local sessions' is ``test_calls_on_fakes.py``'s, on fake kernels)."""
    if request.node.callspec.params["client"] == "local":
        pytest.skip("the registry's logic: tests/execution/test_calls_on_fakes.py")
    await run(client, "doomed = True", session_id="closing")
    results: dict[str, dict] = {}
    started, sent = anyio.Event(), anyio.Event()

    async def slow() -> None:  # 300 s: still running when the session is closed, however slow the machine
        results["slow"] = await run_telling_start(
            client, "import time\ntime.sleep(300)", started, session_id="closing"
        )

    async def queued() -> None:
        await started.wait()
        sent.set()
        results["queued"] = await run(client, "'doomed' in globals()", session_id="closing")

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        tg.start_soon(queued)
        await sent.wait()
        # No hook says the call has reached the session's queue; had it not, it would still run on a
        # fresh session, and every assertion below holds either way.
        structured(await client.call_tool("close_session", {"session_id": "closing"}))
    assert results["slow"]["status"] == "error"
    assert results["slow"]["error"]["name"] == "SessionClosed"
    assert results["queued"]["status"] == "ok"
    assert results["queued"]["results"][0]["text"] == "False"


async def test_progress_keeps_coming_while_output_streams_continuously(client: Client) -> None:
    """Progress is on a clock, not on quiet moments: a chatty loop still reports its latest line."""
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    # Flushed prints with no pause: messages queue up faster than they are read.
    code = "import time\nend = time.time() + 2.5\ni = 0\nwhile time.time() < end:\n    print(f'line {i}', flush=True)\n    i += 1"
    # (A generous limit: on a loaded machine each flushed print can wait on ipykernel's output
    # thread, and this 2.5 s loop once ran past the tests' 30 s default.)
    result = await client.call_tool(
        "run_code", {"code": code, "session_id": "chatty", "timeout": 120}, progress_callback=on_progress
    )
    assert structured(result)["status"] == "ok"
    assert len(messages) >= 1
    assert all(m and m.startswith("line ") for m in messages), messages

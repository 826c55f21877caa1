"""Background jobs outlive their client and their server's restart; a session exports as a notebook.

Jobs run on a real HTTP server process: a client starts a job and disconnects, a second
client collects the result; a job is cancelled with its session's state kept; a server
killed mid-job leaves a record the next server reports as lost, next to a finished job's
result. The exported notebook is validated and re-executed with nbclient.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from mcp import Client

from kernmind.execution.executor import Executor
from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured
from tests.transport.procs import StdioServer, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("transport"), pytest.mark.slow]


async def wait_for_job(client: Client, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = structured(await client.call_tool("job_status", {"job_id": job_id}))
        if status["state"] != "running" or time.monotonic() > deadline:
            return status
        await anyio.sleep(0.2)


async def test_jobs_survive_disconnects_are_cancelled_and_outlive_a_killed_server(tmp_path: Path) -> None:
    server = start_http(tmp_path)
    try:
        async with server.client() as first:
            await first.call_tool("run_code", {"code": "v = 5", "session_id": "c"})
            started = structured(
                await first.call_tool(
                    "run_code",
                    {
                        "code": "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.4)\n'finished'",
                        "session_id": "work",
                        "background": True,
                    },
                )
            )
            assert started["status"] == "running" and started["job_id"].startswith("job-")
            long = structured(
                await first.call_tool(
                    "run_code",
                    {"code": "import time\ntime.sleep(120)", "session_id": "c", "background": True},
                )
            )
        # The first client is gone; a second one collects the result.
        async with server.client() as second:
            done = await wait_for_job(second, started["job_id"])
            assert done["state"] == "done", done
            assert done["result"]["results"][0]["text"] == "'finished'"
            assert "".join(done["result"]["logs"]["stdout"]) == "step 0\nstep 1\nstep 2\n"

            running = structured(await second.call_tool("job_status", {"job_id": long["job_id"]}))
            assert running["state"] == "running" and "result" not in running
            refused = error_text(await second.call_tool("run_code", {"code": "v", "session_id": "c"}))
            assert long["job_id"] in refused and "job_cancel" in refused
            cancelled = structured(await second.call_tool("job_cancel", {"job_id": long["job_id"]}))
            assert cancelled["state"] == "cancelled"
            kept = structured(await second.call_tool("run_code", {"code": "v", "session_id": "c"}))
            assert kept["results"][0]["text"] == "5"  # the interrupt kept the session's state

            lost = structured(
                await second.call_tool(
                    "run_code",
                    {"code": "import time\ntime.sleep(120)", "session_id": "k", "background": True},
                )
            )
            assert "no job" in error_text(await second.call_tool("job_status", {"job_id": "job-nope"}))
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()

    after = StdioServer.start(tmp_path / "b", data_dir=server.data_dir)
    try:
        done = after.call_tool("job_status", {"job_id": started["job_id"]})["structuredContent"]
        assert done["state"] == "done" and done["result"]["results"][0]["text"] == "'finished'"
        gone = after.call_tool("job_status", {"job_id": lost["job_id"]})["structuredContent"]
        assert gone["state"] == "lost" and "stopped before it finished" in gone["note"]
    finally:
        after.kill()


async def test_finished_jobs_leave_server_memory_and_their_results_stay_readable(tmp_path: Path) -> None:
    """Each job displays a large HTML table; once finished, the server holds none of them in
    memory (``Jobs.jobs``), and job_status reads every result back from its record."""
    settings = make_settings(tmp_path, pool_size=0)
    executor = Executor.from_settings(settings)
    code = "from IPython.display import HTML, display\ndisplay(HTML('<td>%d</td>' * 60_000 % tuple(range(60_000))))\n{n}"
    async with Client(create_server(settings, executor)) as c:
        ids = []
        for n in range(3):
            started = await c.call_tool(
                "run_code", {"code": code.format(n=n), "session_id": f"j{n}", "background": True}
            )
            ids.append(structured(started)["job_id"])
        statuses = [await wait_for_job(c, job_id) for job_id in ids]
        for job in list(executor.jobs.jobs.values()):  # (a job says done just before its record is written)
            assert job.done is not None
            await job.done.wait()
        assert not executor.jobs.jobs, list(executor.jobs.jobs)  # none kept in memory
        for n, (job_id, status) in enumerate(zip(ids, statuses, strict=True)):
            again = structured(await c.call_tool("job_status", {"job_id": job_id}))
            for answer in (status, again):
                assert answer["state"] == "done", answer
                results = answer["result"]["results"]
                assert results[-1]["text"] == str(n)
                assert len(results[0]["html"]) > 500_000 and "<td>59999</td>" in results[0]["html"]
        assert not executor.jobs.jobs


NOTEBOOK_CELLS = [
    "print('hello')\n21 * 2",
    "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3]})\ndf.x.sum()",
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    "import sys\nprint('warn', file=sys.stderr)",
    "1 / 0",
]


async def test_export_notebook_validates_and_reruns_to_the_same_outputs(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, pool_size=0)
    async with Client(create_server(settings)) as c:
        for code in NOTEBOOK_CELLS:
            await c.call_tool("run_code", {"code": code, "session_id": "nb"})
        await c.call_tool("run_code", {"code": "echo from bash", "language": "bash", "session_id": "nb"})
        exported = structured(
            await c.call_tool("export_notebook", {"session_id": "nb", "path": "out/analysis.ipynb"})
        )
        assert exported["path"] == "out/analysis.ipynb" and exported["cells"] == len(NOTEBOOK_CELLS) + 1
        empty = error_text(await c.call_tool("export_notebook", {"session_id": "fresh-and-empty"}))
        assert "no session named" in empty or "no recorded calls" in empty

    path = settings.sessions_dir / "local" / "nb" / "files" / "out" / "analysis.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells[-1].source.startswith("%%bash")
    assert code_cells[0].outputs[0] == {"output_type": "stream", "name": "stdout", "text": "hello\n"}
    assert any(o.get("data", {}).get("image/png") for o in code_cells[2].outputs)
    assert code_cells[4].outputs[-1]["output_type"] == "error"
    assert code_cells[4].outputs[-1]["ename"] == "ZeroDivisionError"

    from nbclient import NotebookClient

    rerun = nbformat.read(path, as_version=4)
    NotebookClient(rerun, timeout=120, kernel_name="python3", allow_errors=True).execute(cwd=str(tmp_path))
    assert summary(rerun) == summary(nb)


def summary(nb: nbformat.NotebookNode) -> list[list[tuple[str, str]]]:
    """Each code cell's outputs as (kind, text): streams, plain-text results, error names, image presence."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for o in cell.outputs:
            if o.output_type == "stream":
                outs.append((o.name, o.text))
            elif o.output_type == "execute_result":
                outs.append(("result", o.data["text/plain"]))
            elif o.output_type == "display_data":
                outs.append(
                    ("display", "image/png" if "image/png" in o.data else o.data.get("text/plain", ""))
                )
            elif o.output_type == "error":
                outs.append(("error", o.ename))
        cells.append(sorted(outs))
    return cells

"""A server that dies (SIGKILL, no chance to clean up) takes everything it started with it.

Each case starts a real ``kernmind serve`` over stdio in one sandbox mode, gives it two
Python sessions (one of them with a child process that left the kernel's process group
with ``setsid``), a background job, and a bash call still running, collects every process
below the server from /proc, SIGKILLs the server and checks that none of those processes
(by pid and start time) is alive 5 seconds later. Under bubblewrap the sandbox's pid
namespace and ``--die-with-parent`` do it; with ``--sandbox none`` the lifeline parent
(``execution/sandbox/lifeline.py``) and the fork server's waiter do.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.transport.procs import StdioServer, descendants, wait_until

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

GONE_WITHIN = 5.0
ESCAPE = (
    "import subprocess\nchild = subprocess.Popen(['sleep', '300'], start_new_session=True)\nchild.pid > 0"
)

JOB = "open('job-started', 'w').close()\nimport time\ntime.sleep(300)"


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_sigkilled_server_leaves_no_process(tmp_path: Path, sandbox: str) -> None:
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    server = StdioServer.start(tmp_path, "--sandbox", sandbox)
    try:
        server.call_tool("run_code", {"code": "a = 1"})
        server.call_tool("run_code", {"code": ESCAPE, "session_id": "second"})
        job = server.call_tool("run_code", {"code": JOB, "session_id": "job", "background": True})
        assert job["structuredContent"]["job_id"]
        # A bash call still running when the server dies (its answer never comes).
        server._send(
            {
                "jsonrpc": "2.0",
                "id": 999,
                "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"code": "sleep 300", "language": "bash"}},
            }
        )
        assert wait_until(lambda: any("sleep 300" in p.cmdline for p in descendants(server.proc.pid)), 30.0)
        assert wait_until(lambda: any(tmp_path.rglob("job-started")), 30.0)  # its kernel runs the job
        before = descendants(server.proc.pid)
        sleepers = [p for p in before if p.cmdline.startswith("sleep 300")]
        assert len(sleepers) == 2, [p.cmdline[:100] for p in before]  # the escaped child and bash's
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        left = lambda: [p for p in before if p.alive()]  # noqa: E731
        assert wait_until(lambda: not left(), GONE_WITHIN), [(p.pid, p.cmdline[:120]) for p in left()]
    finally:
        server.kill()

"""A test that hangs past its time limit fails with its stacks, and the run still finishes
(tests/hang_guard.py): here on the way that once held a CI run for 90 minutes, a test stuck
inside ``asyncio.run`` whose executor thread never returns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.transport.procs import read_proc

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import asyncio, os, subprocess, threading

def test_stuck_in_asyncio_run():
    never = threading.Event()
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)  # as a server would be
    with open("child.pid", "w") as out:
        out.write(str(child.pid))

    async def main():
        await asyncio.get_running_loop().run_in_executor(None, never.wait)

    asyncio.run(main())

def test_after_it():
    assert True
"""


pytestmark = pytest.mark.slow  # two pytest runs of their own


@pytest.mark.parametrize(
    "workers",
    [["-n", "1"], ["-n", "2", "--dist", "loadfile"], ["-p", "no:xdist"]],
    ids=["xdist", "loadfile", "plain"],
)
def test_a_hung_test_fails_with_its_stacks_and_the_run_ends(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.hang_guard", "--timeout", "3", *workers]
    run = subprocess.run(
        [*argv, "-p", "no:cacheprovider", "test_hangs.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # without the guard this run never ends
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "Timeout: the test ran past 3 s" in out, out[-3000:]
    assert "in test_stuck_in_asyncio_run" in out and "--- thread" in out, out[-3000:]  # the stacks
    if workers[0] == "-n":
        assert "1 passed" in out, out[-3000:]  # the run went on to the next test
        # ... and did not run the hung test again on the worker that replaced the ended one
        assert out.count("FAILED test_hangs.py::test_stuck_in_asyncio_run - Timeout") == 1, out[-3000:]
    child = int((tmp_path / "child.pid").read_text())
    assert _state(child) in (None, "Z"), _state(child)  # the stuck test's child did not outlive it


def _state(pid: int) -> str | None:
    """The process's state letter, None once it is gone (a killed orphan can stay a zombie for a
    while: this machine's init reaps when it gets to it)."""
    info = read_proc(pid)
    return None if info is None else info.state

"""The sandbox as a normal (non-root) user: unprivileged bubblewrap with a user namespace.

CI runs as root, where kernmind drops every sandbox to its own uid; a laptop user runs
kernmind as themselves, where bubblewrap makes a user namespace and the process limit is
counted on top of that user's own processes. This test runs the sandbox's core modules
(``CORE``: they need only the standard library), without the rest of kernmind, under the
system Python as a dedicated unprivileged user and checks the same promises as the root-mode
suite: confinement, no network, a clean environment, and contained fork and memory bombs.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernmind.execution.sandbox.bwrap as sandbox_module

USER = "kernmind-ci"
SYSTEM_PYTHON = "/usr/bin/python3"
# The sandbox's core, copied as they are: the entry point and what it builds command lines
# with, the seccomp filters, the creation guard, and the lifeline run as a script beside them.
CORE = (
    "bwrap.py",
    "rlimits.py",
    "bwrap_args.py",
    "launcher.py",
    "filter_files.py",
    "seccomp.py",
    "host_mounts.py",
    "creation_guard.py",
    "lifeline.py",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("security"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create and switch to a test user"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed"),
    pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no {SYSTEM_PYTHON} for the test user"),
]

DRIVER = r"""
import json, subprocess, sys
from pathlib import Path
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.rlimits import Limits

sandbox = Sandbox.detect("auto", limits=Limits(memory_mb=256, max_processes=48))
ws = Path(sys.argv[1])

def run(code):
    cmd = sandbox.wrap(["/usr/bin/python3", "-c", code], workspace=ws)
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    return (proc.stdout.strip() or proc.stderr.strip()[-300:])

report = {"backend": sandbox.backend, "reason": sandbox.reason, "as_root": sandbox.as_root}
report["place"] = run(
    "import os; open('made.txt', 'w').write('x'); "
    "print(os.getcwd(), os.path.exists('/home'), os.path.exists('/root'), os.access('/usr', os.W_OK))"
)
report["net"] = run("import socket; print(sorted(n for _, n in socket.if_nameindex()))")
report["env"] = run("import os; print(sorted(os.environ))")
report["fork"] = run(
    "import subprocess\n"
    "kids = []\n"
    "try:\n"
    "    for _ in range(400): kids.append(subprocess.Popen(['sleep', '5']))\n"
    "except OSError as e:\n"
    "    print(len(kids), e.errno)\n"
    "else:\n"
    "    print(len(kids), 0)\n"
)
report["memory"] = run(
    "try:\n    x = bytearray(2 * 1024 ** 3)\n    print('allocated')\nexcept MemoryError:\n    print('MemoryError')"
)
# Over the workspace quota: no file may grow, and code cannot lift its own file-size limit (seccomp).
from dataclasses import replace
blocked = replace(sandbox.limits, writes_blocked=True)
cmd = sandbox.wrap(["/usr/bin/python3", "-c", (
    "import os, resource\n"
    "try:\n    resource.setrlimit(resource.RLIMIT_FSIZE, resource.getrlimit(resource.RLIMIT_FSIZE)[1:] * 2); r = 'lifted'\n"
    "except (ValueError, OSError):\n    r = 'refused'\n"
    "try:\n    os.write(os.open('blocked.bin', os.O_WRONLY | os.O_CREAT), b'x'); w = 'wrote'\n"
    "except OSError as e:\n    w = e.errno\n"
    "print(r, w)")], workspace=ws, limits=blocked)
proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
report["blocked"] = proc.stdout.strip() or proc.stderr.strip()[-300:]
report["seccomp"] = sandbox.seccomp is not None
# A long-lived command (a kernel) under the creation guard: it creates under the quota; once its
# processes get the write block (soft RLIMIT_FSIZE 0, as the quota sets it), it creates nothing.
import os, resource
report["guard"] = sandbox.guard_problem
if sandbox.guard is not None:
    cmd = sandbox.wrap(["/usr/bin/python3", "-u", "-c", (
        "import os, sys\n"
        "os.mkdir('under'); print('made', flush=True)\n"
        "sys.stdin.readline()\n"
        "try:\n    os.mkdir('over'); r = 'made'\nexcept OSError as e:\n    r = e.errno\n"
        "os.rmdir('under'); print(r, flush=True)")], workspace=ws, guard=True)
    proc = subprocess.Popen(cmd.argv, env=cmd.env, cwd=cmd.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    todo, tree = [proc.pid], []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        for tid in os.listdir(f"/proc/{pid}/task"):
            todo += [int(c) for c in open(f"/proc/{pid}/task/{tid}/children").read().split()]
    for pid in tree:
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]))
        except OSError:
            pass
    out, _ = proc.communicate("go\n", timeout=60)
    report["guarded"] = f"{first} {out.strip()}"
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def test_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(USER)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the test user can reach (pytest's own tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="kernmind-unpriv-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unprivileged_sandbox_confines_code(shared_dir: Path, test_user: pwd.struct_passwd) -> None:
    tmp_path = shared_dir
    lib = tmp_path / "lib"
    lib.mkdir(mode=0o755)
    # The core at its own place in an otherwise empty package: nothing else of kernmind.
    package = lib / "kernmind" / "execution" / "sandbox"
    package.mkdir(parents=True, mode=0o755)
    levels = (lib / "kernmind", lib / "kernmind" / "execution", package)
    for d in levels:
        d.chmod(0o755)
        (d / "__init__.py").write_text("")
    for name in CORE:
        shutil.copy(Path(sandbox_module.__file__).with_name(name), package / name)
    (lib / "driver.py").write_text(DRIVER)
    for f in [*lib.iterdir(), *(f for d in levels for f in d.iterdir())]:
        if f.is_file():
            f.chmod(0o644)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, test_user.pw_uid, test_user.pw_gid)

    proc = subprocess.run(
        ["setpriv", f"--reuid={test_user.pw_uid}", f"--regid={test_user.pw_gid}", "--clear-groups",
         SYSTEM_PYTHON, str(lib / "driver.py"), str(ws)],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(lib),
             "SECRET_FROM_PARENT": "sk-should-not-leak"},
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["backend"] != "bwrap":
        pytest.skip(f"unprivileged bubblewrap is unavailable here: {report['reason']}")

    assert report["as_root"] is False
    # Confined: the workspace is /workspace and writable; no /home, no /root; /usr read-only.
    assert report["place"] == "/workspace False False False"
    assert (ws / "made.txt").read_text() == "x"
    # No network: only a loopback interface.
    assert report["net"] == "['lo']"
    # A clean environment: the parent's variables are not inherited.
    assert "SECRET_FROM_PARENT" not in report["env"] and "PATH" in report["env"]
    # A fork bomb stops at the process limit (counted on top of the user's own processes).
    started, errno = map(int, report["fork"].split())
    assert started < 100 and errno == 11  # EAGAIN
    # Memory beyond the limit is refused.
    assert report["memory"] == "MemoryError"
    # Writes blocked (the workspace quota): the file cannot grow and the block cannot be lifted.
    assert report["seccomp"] is True
    assert report["blocked"] == "refused 122"  # 122: EDQUOT, not even created (the over-quota filter)

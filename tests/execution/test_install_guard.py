"""Installing from inside code fails at once and names install_packages; a failing ``!cmd``
shows in the result. Checked in a real sandboxed kernel and a real sandboxed bash."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernmind.execution.kernels import Kernel, KernelFactory, PythonRuntime
from kernmind.execution.packages.guard import KERNEL_GUARD, guard_environment, write_shims
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import DEFAULT_PATH, Sandbox

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages")]


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox.detect("auto")


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shims")
    root.chmod(0o755)
    return write_shims(root / "bin")


@pytest.fixture(scope="module")
async def kernel(
    sandbox: Sandbox, shims: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Kernel]:
    runtime = PythonRuntime.probe(None)
    runtime = dataclasses.replace(runtime, paths=(*runtime.paths, str(shims)))
    env = guard_environment(shims, f"{os.path.dirname(runtime.executable)}:{DEFAULT_PATH}")
    factory = KernelFactory.standalone(sandbox, runtime, tmp_path_factory.mktemp("ws"), extra_env=env)
    k = await factory.start()
    outcome = await k.execute(
        KERNEL_GUARD, OutputCollector(10_000), deadline=time.monotonic() + 30, silent=True
    )
    assert outcome.kind == "ok"
    yield k
    await k.shutdown()


async def run(kernel: Kernel, code: str) -> tuple[str, OutputCollector]:
    collector = OutputCollector(50_000)
    outcome = await kernel.execute(code, collector, deadline=time.monotonic() + 60)
    return outcome.kind, collector


@pytest.mark.parametrize(
    "code",
    [
        "%pip install openpyxl",
        "!pip install openpyxl",
        "!pip3 install -q openpyxl",
        "!python -m pip install openpyxl",
        "!uv pip install openpyxl",
        "!cd /tmp && npm install lodash",
        "%conda install numpy",
    ],
)
async def test_installing_from_a_cell_is_an_error_naming_install_packages(kernel: Kernel, code: str) -> None:
    kind, out = await run(kernel, code)
    assert kind == "error"
    assert out.error is not None and out.error.name == "InstallFromCodeRefused"
    assert "install_packages" in out.error.value


async def test_pip_from_a_subprocess_fails_at_once_without_the_network(kernel: Kernel) -> None:
    code = (
        "import subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-m', 'pip', 'install', 'surely-not-installed-xyz'], capture_output=True, text=True)\n"
        "p.returncode, 'Could not find a version' in p.stderr or 'No module named pip' in p.stderr"
    )
    kind, out = await run(kernel, code)
    assert kind == "ok" and out.results[0].text == "(1, True)"


async def test_a_failing_shell_command_shows_its_exit_code(kernel: Kernel) -> None:
    kind, out = await run(kernel, "!echo before; exit 3")
    assert kind == "ok"
    assert "before" in "".join(out.stdout)
    assert "[!echo before; exit 3 exited with code 3]" in "".join(out.stderr)
    kind, out = await run(kernel, "!true")
    assert "".join(out.stderr) == ""
    kind, out = await run(kernel, "%pip --version")
    assert kind == "ok" and "pip" in "".join(out.stdout)


def test_installers_in_the_sandboxs_shell_refuse_and_other_commands_pass(
    sandbox: Sandbox, shims: Path, tmp_path: Path
) -> None:
    script = (
        "pip install openpyxl; echo pip=$?; uv pip install x; echo uv=$?; npm install lodash; echo npm=$?;"
        "npm --version >/dev/null; echo version=$?"
    )
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(tmp_path, uid, uid)
    cmd = sandbox.wrap(
        ["bash", "--noprofile", "--norc", "-c", script],
        workspace=tmp_path,
        env=guard_environment(shims, DEFAULT_PATH),
        ro_paths=[str(shims)],
        uid=uid,
    )
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["pip=1", "uv=1", "npm=1", "version=0"], proc.stderr
    for tool in ("pip", "uv", "npm"):
        assert f"{tool}: packages cannot be installed from inside the sandbox" in proc.stderr
    assert proc.stderr.count("install_packages tool") == 3

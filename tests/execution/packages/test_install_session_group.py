"""A session's install runs in the session's control group (issue 23: one memory limit per session).

``install_packages`` sets the session's limits as ``current_limits`` (``installs.py``); then uv
(on the host, wheels), a source build (``--allow-sdist``, in a sandbox with no network) and
Deno fetching npm packages run in the session's group. Real uv, a real sandboxed build from a wheelhouse the test writes, a
real control group with a 300 MiB memory limit: a build's memory (here files in its in-memory
``/dev/shm``) is charged to the session, and a build that outgrows it is stopped and refused
with a sentence that names ``--memory-mb``; nothing is added, and the session installs again
afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import (
    Layer,
    PackageError,
    PackageInstaller,
    PackagePolicy,
    PackageSources,
    PythonTarget,
)
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.execution.sandbox.limits import SessionLimits, current_limits
from kernmind.execution.sandbox.rlimits import Limits
from tests.execution.packages.package_sources import NpmRegistry, make_sdist, make_wheel

SANDBOX = Sandbox.detect("auto")
SUPPORT = CgroupSupport.detect()

pytestmark = [
    pytest.mark.slow,  # real kernels, sandboxes or servers
    pytest.mark.anyio,
    pytest.mark.xdist_group("packages"),
    pytest.mark.skipif(not SANDBOX.isolated, reason=f"no sandbox here: {SANDBOX.reason}"),
    pytest.mark.skipif(not SUPPORT.active, reason=f"no control groups here: {SUPPORT.reason}"),
]

MIB = 2**20


def fill_shm(mib: int) -> str:
    return f"f = open('/dev/shm/fill', 'wb')\nfor _ in range({mib}):\n    f.write(b'x' * 2**20)\nf.flush()\n"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheelhouse")
    d.chmod(0o755)  # the sandboxed build reads it as another uid
    make_sdist(d, "modest", "1.0", build_code=fill_shm(64))  # 64 MiB: fits in 300
    make_sdist(d, "hog", "1.0", build_code=fill_shm(450))  # 450 MiB: /dev/shm holds it, the session not
    make_wheel(d, "plain", "1.0")
    return d


@pytest.fixture
def session() -> Iterator[SessionLimits]:
    limits = SessionLimits(SUPPORT, Limits(memory_mb=300, max_processes=64))
    assert limits.ensure_group() is not None
    token = current_limits.set(limits)  # what installs.py does for install_packages
    try:
        yield limits
    finally:
        current_limits.reset(token)
        limits.close()


def installer(wheelhouse: Path, cache: Path) -> PackageInstaller:
    runtime = PythonRuntime.probe(None)
    return PackageInstaller(
        PackagePolicy(sources=PackageSources(None, (), (str(wheelhouse),)), allow_sdist=True),
        PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath),
        cache,
        SANDBOX,
        PackageInstaller.find_deno(),
        PackageInstaller.find_uv(),
        {},
    )


async def test_a_build_runs_in_the_sessions_group_and_one_past_its_memory_is_stopped(
    session: SessionLimits, wheelhouse: Path, tmp_path: Path
) -> None:
    install = installer(wheelhouse, tmp_path / "cache")
    group = session.group
    assert group is not None and not group.pids()
    layer = Layer(tmp_path / "layer").create()
    result = await install.install(["modest"], "python", layer)
    assert [p.name for p in result.installed] == ["modest"]
    peak = group.memory_peak()
    assert peak is not None and peak >= 64 * MIB, peak  # the build's /dev/shm was the session's
    with pytest.raises(PackageError) as caught:
        await install.install(["hog"], "python", layer)
    assert caught.value.kind == "memory", caught.value.message
    assert "300 MiB memory limit (--memory-mb)" in caught.value.message
    assert "nothing was added" in caught.value.message
    assert "hog" not in layer.python_distributions()
    # The session goes on: the next install works (uv on the host, in the same group).
    again = await install.install(["plain"], "python", layer)
    assert [p.name for p in again.installed] == ["plain"]
    assert set(layer.python_distributions()) >= {"modest", "plain"}


async def test_deno_fetching_npm_packages_runs_in_the_sessions_group(
    session: SessionLimits, wheelhouse: Path, tmp_path: Path
) -> None:
    install = installer(wheelhouse, tmp_path / "cache")
    if install.deno is None:
        pytest.skip("Deno is not installed")
    group = session.group
    assert group is not None and not group.pids()
    before = group.memory_peak()
    assert before is not None and before < MIB, before  # a new group: nothing ran in it yet
    layer = Layer(tmp_path / "layer").create()
    with NpmRegistry({"leftpad": {"1.0.0": "module.exports = (s) => s;"}}).running() as registry:
        install.host_env["NPM_CONFIG_REGISTRY"] = f"{registry.url}/"
        result = await install.install(["npm:leftpad@1"], "javascript", layer)
    assert [p.name for p in result.installed] == ["leftpad"]
    peak = group.memory_peak()
    # Deno's memory was charged to the session (its binary's pages, already cached, are not: a
    # few MiB of its own; 0 when it runs outside the group).
    assert peak is not None and peak >= 2 * MIB, peak

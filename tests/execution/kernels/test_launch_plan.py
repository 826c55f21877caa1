"""A local kernel's launch plan (``kernels/local.py``), which normal starts and forks share.

What a plan decides before anything runs, and what it undoes when a start fails, checked
in milliseconds with the real sandbox's command line (no kernel is launched here; the real
starts are in ``test_kernel_python.py`` and ``test_forkserver.py``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kernmind.execution.kernels.forkserver.kernels import PLACEHOLDER
from kernmind.execution.kernels.local import KERNEL_ARGS, KernelFactory, LaunchPlan
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.launcher import lifeline_argv
from kernmind.execution.sandbox.workspace import Workspace

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(Sandbox.detect("auto").backend != "bwrap", reason="bubblewrap is not usable here"),
]


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> KernelFactory:
    return KernelFactory.standalone(
        Sandbox.detect("required"), PythonRuntime.probe(None), tmp_path_factory.mktemp("plan")
    )


def test_a_plan_gives_the_kernel_its_variables_its_directory_and_its_sockets(factory: KernelFactory) -> None:
    plan = LaunchPlan.make(factory, None, None)
    assert plan.made_workspace and plan.workspace.root.is_dir()
    assert plan.workspace.accounted == [plan.runtime_dir]  # its sockets count against the quota
    assert plan.cwd == factory.sandbox.workspace_path(plan.workspace.root)
    assert plan.env["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"
    assert plan.env["IPYTHONDIR"].startswith("/tmp/")  # caches in the sandbox's private /tmp
    args = plan.start_arguments()
    assert args["env"] is plan.env  # one environment for the command line and the process
    assert (args["cwd"], args["extra_arguments"]) == (str(plan.workspace.root), list(KERNEL_ARGS))


def test_the_kernel_and_the_fork_servers_placeholder_get_the_same_sandbox_but_the_uid(
    factory: KernelFactory,
) -> None:
    plan = LaunchPlan.make(factory, None, None)
    kernel = plan.wrap(["/usr/bin/python3", "-m", "ipykernel_launcher"])
    placeholder = plan.wrap(PLACEHOLDER, as_kernel=False)
    assert kernel[-3:] == ["/usr/bin/python3", "-m", "ipykernel_launcher"]
    assert placeholder[-len(PLACEHOLDER) :] == PLACEHOLDER
    if factory.sandbox.guard is not None:  # only the kernel has the creation guard's parent in front
        guard = lifeline_argv([], guard=factory.sandbox.guard)
        at = next(i for i in range(len(kernel)) if kernel[i : i + len(guard)] == guard)
        kernel = kernel[:at] + kernel[at + len(guard) :]
        assert not any("lifeline.py" in a for a in placeholder)
    sandbox = placeholder[: -len(PLACEHOLDER)]
    assert kernel[: len(sandbox)] == sandbox  # the same namespaces, mounts, limits, environment
    if plan.uid is not None:  # (a server that is not root runs kernels as itself)
        assert f"--reuid={plan.uid}" in kernel[len(sandbox) :]  # only the kernel drops to the uid
        assert not any(a.startswith("--reuid=") for a in placeholder)


async def test_a_failed_start_removes_what_the_plan_made_and_leaves_a_given_workspace(
    factory: KernelFactory, tmp_path: Path
) -> None:
    made = LaunchPlan.make(factory, None, None)
    given = LaunchPlan.make(factory, Workspace(tmp_path / "home"), None)
    assert not given.made_workspace
    assert given.workspace.owner_uid == given.uid
    for plan in (made, given):
        kernel = plan.kernel(SimpleNamespace(provisioner=None))  # type: ignore[arg-type]
        assert (kernel.workspace, kernel.runtime_dir, kernel.uid) == (
            plan.workspace,
            plan.runtime_dir,
            plan.uid,
        )
        await plan.abandon(kernel)
        assert not plan.runtime_dir.exists()
    assert not made.workspace.root.exists()
    assert given.workspace.root.is_dir()

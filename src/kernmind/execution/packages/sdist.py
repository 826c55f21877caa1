"""Builds from source (``--allow-sdist``): the whole install runs in a sandbox with no network.

Design (docs/security.md, "Packages"): uv runs in ``Sandbox.wrap`` as a fresh uid with a private
scratch directory and cache (the shared one could be poisoned), from sources ``fetch.py``
downloaded first (more rounds for what an offline resolution names missing); the result is
moved into the layer by ``merge_untrusted_tree``.

Error policy: a failed build is a ``PackageError`` ("build_failed" with its output's tail, or
what ``diagnose.explain`` recognises).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from packaging.requirements import Requirement

from kernmind.execution.packages.fetch import Fetcher, Target, missing_projects
from kernmind.execution.packages.layer import distributions_in, merge_untrusted_tree
from kernmind.execution.packages.policy import PackageError, PackageSources
from kernmind.execution.packages.python import (
    Installed,
    PythonTarget,
    Resolution,
    check_session_memory,
    resolve_and_install,
)
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.limits import current_limits


@dataclass
class SandboxUv:
    """uv run inside the sandbox, with ``work`` as its working directory."""

    sandbox: Sandbox
    binary: str
    work: Path
    ro_paths: list[str]
    env: dict[str, str]
    uid: int | None

    def path(self, host: Path) -> str:
        try:
            rel = host.relative_to(self.work)
        except ValueError:
            return str(host)  # mounted read-only at the same path
        return str(Path(self.sandbox.workspace_path(self.work)) / rel)

    async def __call__(self, args: Sequence[str], *, timeout: float) -> tuple[int, str, str]:
        # A session's install: the build counts against the session's memory and processes. Not
        # its write block: it writes to this scratch directory, outside the workspace's quota.
        session = current_limits.get()
        cmd = self.sandbox.wrap(
            [self.binary, *args],
            workspace=self.work,
            env=self.env,
            ro_paths=self.ro_paths,
            uid=self.uid,
            join=session.join_files() if session is not None else (),
        )
        with anyio.fail_after(timeout):
            proc = await anyio.run_process(cmd.argv, env=cmd.env, cwd=cmd.cwd, check=False)
        check_session_memory(session)
        err = proc.stderr.decode(errors="replace")
        if proc.returncode != 0:
            self.last_error = err
        return proc.returncode, proc.stdout.decode(errors="replace"), err

    last_error: str = ""


async def build_in_sandbox(
    sandbox: Sandbox,
    requirements: Sequence[Requirement],
    *,
    uv_binary: str,
    target: PythonTarget,
    installed: Installed,
    sources: PackageSources,
    layer_dir: Path,
    proxy_env: Mapping[str, str],
    timeout: float,
) -> tuple[Resolution, list[str]]:
    """Resolve, build and install ``requirements`` in a sandbox into ``layer_dir``; returns the resolution and
    the paths not taken over."""
    box = replace(sandbox, allow_network=False) if sandbox.isolated else sandbox
    uid = sandbox.allocate_uid()
    work = await anyio.to_thread.run_sync(_make_work_dir, uid, installed.base_stubs)
    try:
        env = {
            "HOME": sandbox.workspace_path(work),
            "UV_NO_PROGRESS": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_OFFLINE": "1",
            "NO_COLOR": "1",
        }
        if target.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(target.pythonpath)
        downloads = work / "downloads"
        ro = [uv_binary, *target.paths, *sources.local_dirs]
        runner = SandboxUv(box, uv_binary, work, ro, env, uid)
        offline = PackageSources(None, (), (runner.path(downloads), *sources.local_dirs))
        fetcher: Fetcher | None = None
        if sources.remote:
            python = await anyio.to_thread.run_sync(Target.probe, target.executable)
            fetcher = Fetcher(sources, python, installed.available, downloads, proxy_env)
            await anyio.to_thread.run_sync(fetcher.fetch, requirements)
        await anyio.to_thread.run_sync(_make_downloads, downloads)
        for attempt in range(FETCH_ROUNDS):
            try:
                resolution = await resolve_and_install(
                    runner,
                    requirements,
                    target=target,
                    installed=replace(installed, base_stubs=work / "scratch" / "base-stubs"),
                    sources=offline,
                    install_dir=work / "out",
                    cache_dir=work / "cache",
                    scratch=work / "scratch",
                    wheels_only=False,
                    timeout=timeout,
                )
                break
            except PackageError as exc:
                missing = [
                    m for m in missing_projects(runner.last_error) if fetcher and m not in fetcher.fetched
                ]
                if fetcher is not None and missing and attempt + 1 < FETCH_ROUNDS:
                    await anyio.to_thread.run_sync(fetcher.fetch, [Requirement(m) for m in missing])
                    continue
                if exc.kind == "installer":
                    raise PackageError(
                        "build_failed", f"building from source (inside the sandbox) failed: {exc.message}"
                    ) from None
                raise
        out = work / "out"
        if not out.is_dir():
            return resolution, []
        (out / ".lock").unlink(missing_ok=True)  # uv's lock for the target directory
        arrived = distributions_in(out)
        skipped = await anyio.to_thread.run_sync(merge_untrusted_tree, out, layer_dir)
        installed = [arrived.get(d.key, d) for d in resolution.installed]
        return Resolution(installed, resolution.already), skipped
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove, work)


FETCH_ROUNDS = 3  # offline resolutions, each after fetching what the previous one missed


def _make_downloads(downloads: Path) -> None:
    downloads.mkdir(exist_ok=True)
    os.chmod(downloads, 0o755)


def _make_work_dir(uid: int | None, base_stubs: Path) -> Path:
    """The build's scratch directory (the sandbox's workspace, owned by its uid), with a copy
    of the stub wheels, so that the sandbox needs no view of the shared cache."""
    work = Path(tempfile.mkdtemp(prefix="kernmind-build-"))
    shutil.copytree(base_stubs, work / "scratch" / "base-stubs")
    os.chmod(work, 0o755)
    if uid is not None:
        os.chown(work, uid, uid)
    return work


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path)

"""``install_packages``' route through the executor: refusals, the held session, its kernel.

Design
- The installer (``packages/``) knows layers, not sessions; this module is the step between:
  hold the session (``sessions.hold``: one call at a time, as ``run_code``), install into its
  layer, keep a copy of the layer in the stored session (``package_layers.keep``), write its
  meta at once (a server killed right after the install must still count and list what it
  kept), and put the layer on the running kernel's path. While it installs, the session's
  limits are ``current_limits``: uv and a source build run in the session's control group.
- The notes say how to use what was installed: importable at once in Python (and on bash's
  ``PYTHONPATH``), or with an ``npm:`` specifier in JavaScript/TypeScript.

Error policy: a server that can never keep an install (``--stateless``, Python on a kernel
gateway) refuses with a ``SessionError`` sentence; the installer's refusals are
``PackageError`` sentences (both ``ValueError``s, answered by the error boundary).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernmind.execution.errors import SessionError
from kernmind.execution.packages import InstallResult
from kernmind.execution.runners.python import PythonRunner
from kernmind.execution.sandbox.limits import current_limits
from kernmind.execution.sessions import package_layers
from kernmind.execution.sessions.session import DEFAULT_SESSION

if TYPE_CHECKING:
    from kernmind.execution.executor import Executor

STATELESS_REFUSAL = (
    "install_packages is not available on this server: it runs with --stateless, so every run_code "
    "call starts from a fresh interpreter and an installed package would be gone before the next "
    "call. Use the packages that are already installed, or ask the operator to run without --stateless."
)

GATEWAY_PACKAGES_REFUSAL = (
    "install_packages is not available on this server: Python runs on a kernel gateway "
    "(--kernel-gateway), whose kernels get their packages from the gateway's kernel image. Use the "
    "packages installed there, or ask the operator to add them to that image."
)


async def install(
    ex: Executor, packages: list[str], *, owner: str, language: str, session_id: str | None
) -> InstallResult:
    """Install ``packages`` for ``language`` (already canonical: ``python``, ``javascript``,
    ``typescript``) into the session's layer."""
    if ex.settings.stateless:
        raise SessionError(STATELESS_REFUSAL)
    if ex.remote is not None:
        raise SessionError(GATEWAY_PACKAGES_REFUSAL)
    async with ex.sessions.hold(session_id, owner=owner) as session:
        token = current_limits.set(ex.limits_of(session))  # its processes run in the session's group
        try:
            result = await ex.packages.install(packages, language, session.layer())
        finally:
            current_limits.reset(token)
        if result.installed and (not_kept := await package_layers.keep(session, ex.store)):
            result.notes.append(not_kept)
        if result.installed and session.home is not None:
            # the kept packages' size is in the meta now, not a moment later: a server killed
            # right after the install must still find them counted (and listed)
            await ex.sessions.books.save_meta(session)
        if language == "python" and result.installed:
            kernel = PythonRunner.kernel_of(session)
            if kernel is None or await kernel.use_packages():
                result.notes.append(
                    "importable now in this session's Python (no restart needed) and, on "
                    "PYTHONPATH, in its bash calls."
                )
            else:
                result.notes.append(
                    "installed, but the running interpreter did not take the new path: "
                    "run_code with reset=true to use the packages."
                )
        elif language != "python" and result.installed:
            name = result.installed[0].name
            result.notes.append(
                f'import them by npm: specifier in this session, e.g. import x from "npm:{name}".'
            )
    result.session_id = session_id or DEFAULT_SESSION
    return result

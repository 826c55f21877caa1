"""``install_packages``' route through the executor: refusals, the held session, its kernel.

Design: the installer (``packages/``) knows layers, not sessions; this module holds the session
(``sessions.hold``, as ``run_code``), installs into its layer with the session's limits as
``current_limits`` (uv and a source build run in its control group), keeps a copy in the stored
session (``package_layers.keep``), writes its meta at once (a server killed right after must
still count what it kept), and puts the layer on the running kernel's path.

Error policy: a server that can never keep an install (``--stateless``, Python on a kernel
gateway) refuses with a ``SessionError`` sentence; the installer's refusals are
``PackageError`` sentences (both ``ValueError``s, answered by the error boundary).
"""

from __future__ import annotations

from kernmind.execution.errors import SessionError
from kernmind.execution.packages import InstallResult, PackageInstaller
from kernmind.execution.runners.python import PythonRunner
from kernmind.execution.sandbox.limits import SessionLimits, current_limits
from kernmind.execution.sessions import package_layers
from kernmind.execution.sessions.books import Books
from kernmind.execution.sessions.disk_store import SessionStore
from kernmind.execution.sessions.session import Session

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


def refuse(*, stateless: bool, gateway: bool) -> None:
    """``SessionError`` when this server can never keep an install."""
    if stateless:
        raise SessionError(STATELESS_REFUSAL)
    if gateway:
        raise SessionError(GATEWAY_PACKAGES_REFUSAL)


async def install(
    installer: PackageInstaller,
    books: Books,
    store: SessionStore,
    session: Session,
    packages: list[str],
    language: str,
    limits: SessionLimits,
) -> InstallResult:
    """Install ``packages`` for ``language`` (canonical: ``python``, ``javascript``, ``typescript``)
    into the held ``session``'s layer, its processes in the session's group (``limits``)."""
    token = current_limits.set(limits)
    try:
        result = await installer.install(packages, language, session.layer())
    finally:
        current_limits.reset(token)
    if not result.installed:
        return result
    if session.home is not None:
        if not_kept := await package_layers.keep(session, store):
            result.notes.append(not_kept)
        # the kept packages' size is in the meta now, not a moment later: a server killed right
        # after the install must still find them counted (and listed)
        await books.save_meta(session)
    if language == "python":
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
    else:
        name = result.installed[0].name
        result.notes.append(
            f'import them by npm: specifier in this session, e.g. import x from "npm:{name}".'
        )
    return result

"""The seccomp filter files this machine's sandboxes load: which exist here, and which load.

Design: ``seccomp_file`` (ordinary or ``over_quota``), ``unsandboxed_seccomp`` (the lifeline
loads it without bubblewrap; tried once) and ``guard_file`` (the creation guard's, where it works).

Error policy: the filter never costs the sandbox itself: a filter that cannot be had is
logged and commands run without it (``Sandbox.quota_enforcement`` says what that leaves open).
"""

from __future__ import annotations

import logging
import subprocess
import sys

from kernmind.execution.sandbox.launcher import lifeline_argv

log = logging.getLogger(__name__)


def seccomp_file(*, over_quota: bool = False) -> str | None:
    """The file holding kernmind's seccomp filter for this machine (None: none for it);
    ``over_quota``: the stricter one of a sandbox whose session is over its quota."""
    try:
        from kernmind.execution.sandbox import seccomp
    except ImportError:  # copied without the filter's module
        return None

    data = seccomp.program(over_quota=over_quota)
    if data is None:
        return None
    try:
        return seccomp.filter_file(data)
    except OSError as exc:
        log.warning("cannot write the seccomp filter (%s); sandboxes run without it", exc)
        return None


def unsandboxed_seccomp() -> str | None:
    """The filter for commands run without bubblewrap, when a lifeline can load it here."""
    path = seccomp_file()
    if path is None or sys.platform != "linux":
        return None
    try:
        loaded = subprocess.run(lifeline_argv(["true"], path), capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot try the seccomp filter without bubblewrap (%s); commands run without it", exc)
        return None
    if loaded.returncode != 0:
        log.warning(
            "the seccomp filter cannot be loaded here (%s); commands run without it",
            loaded.stderr.decode(errors="replace").strip()[-200:],
        )
        return None
    return path


def guard_file() -> tuple[str | None, str | None]:
    """(the creation guard's filter file, None) where the guard works here, else (None, why)."""
    try:
        from kernmind.execution.sandbox import creation_guard
    except ImportError:  # copied without the guard's module
        return None, "kernmind's seccomp module is not available"
    return creation_guard.filter_file_here()

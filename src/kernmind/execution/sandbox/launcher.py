"""What runs in front of a sandboxed command: the shell that joins its control groups and
opens its seccomp filter, and the lifeline parent that ends its tree with the server.

Design: ``launcher_argv`` writes its pid into each ``cgroup.procs`` (in the group from the first
instruction) and opens the filter as descriptor 9 for ``--seccomp 9``; ``lifeline_argv`` puts
``lifeline.py`` in front (Linux only). Standard library only, like the sandbox's core.

Error policy: none raised here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

# The launcher's script: $1 is the filter file (or empty), then cgroup.procs files up to "--".
_JOIN = 'f=$1; shift; while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '


def launcher_argv(argv: list[str], seccomp: str | None, join: Sequence[str | Path]) -> list[str]:
    """``argv`` started in the control groups whose ``cgroup.procs`` files are ``join``, with
    the filter file ``seccomp`` open as descriptor 9; ``argv`` itself when there is neither."""
    if seccomp is None and not join:
        return argv
    run = 'exec "$@" 9<"$f"' if seccomp is not None else 'exec "$@"'
    return ["/bin/sh", "-c", _JOIN + run, "kernmind-sandbox", seccomp or "", *map(str, join), "--", *argv]


def lifeline_argv(argv: Sequence[str], seccomp: str | None = None, guard: str | None = None) -> list[str]:
    """``argv`` under a parent that kills its tree when the server dies, with ``seccomp``/``guard`` loaded."""
    if sys.platform != "linux":
        return list(argv)
    script = str(Path(__file__).with_name("lifeline.py"))
    filtered = ["--seccomp", seccomp] if seccomp is not None else []
    filtered += ["--guard", guard] if guard is not None else []
    return [sys.executable, "-S", "-E", "-s", script, str(os.getpid()), *filtered, "--", *argv]

"""Set rlimits, then exec a command: the fallback when util-linux ``prlimit`` is missing.

Usage: ``python -m kernmind.execution.sandbox.rlimit_exec "{'data': N, ...}" -- argv...``
"""

from __future__ import annotations

import ast
import os
import resource
import sys

NAMES = {
    "data": resource.RLIMIT_DATA,
    "cpu": resource.RLIMIT_CPU,
    "nproc": getattr(resource, "RLIMIT_NPROC", None),
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


def main() -> None:
    limits = ast.literal_eval(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    for name, value in limits.items():
        which = NAMES.get(name)
        if which is None:
            continue
        try:
            resource.setrlimit(which, tuple(value) if isinstance(value, tuple) else (value, value))
        except (ValueError, OSError):
            pass  # e.g. macOS refuses some limits; best effort
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()

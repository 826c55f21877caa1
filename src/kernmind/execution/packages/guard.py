"""Installing from inside code fails at once, and says to call ``install_packages``.

Design (the sandbox has no network: ``pip install`` there spent seconds retrying DNS):
- kernel (``KERNEL_GUARD``, in the setup cell): install magics and ``!`` commands raise
  ``InstallFromCodeRefused``; another ``!cmd`` that exits non-zero says so on stderr;
- shell (``write_shims``): ``pip``, ``uv``, ``npm``, ``conda``… shims refuse install-like
  subcommands and hand the rest to the real tool;
- environment: ``PIP_NO_INDEX``, ``UV_OFFLINE`` and npm's ``offline`` fail what slips past.

Error policy: every refusal is the same sentence naming the tool and ``install_packages``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.bwrap_args import Mount

REFUSAL = (
    "packages cannot be installed from inside the sandbox (it has no network). Call the "
    'install_packages tool instead, e.g. install_packages(packages=["openpyxl"]) for Python or '
    'install_packages(packages=["npm:lodash@4"], language="javascript"); the packages become '
    "importable in this session without a restart."
)

INSTALLERS = ("pip", "pip3", "uv", "npm", "yarn", "pnpm", "conda", "mamba")

_SHIM = r"""#!/bin/sh
# kernmind: package installs go through the install_packages tool (the sandbox has no network).
name=$(basename "$0")
case "$name:$1:$2" in
  *:install:*|*:add:*|*:download:*|npm:i:*|npm:ci:*|uv:pip:install|uv:pip:sync|uv:sync:*|uv:tool:*)
    printf '%s: %s\n' "$name" '{refusal}' >&2
    exit 1 ;;
esac
# Anything else: the real tool, found on PATH without this directory.
here=$(cd "$(dirname "$0")" && pwd)
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$here" | paste -sd: -)
export PATH
exec "$name" "$@"
"""

KERNEL_GUARD = f"""
def _kernmind_install_guard():
    import re, sys

    refusal = {REFUSAL!r}

    class InstallFromCodeRefused(RuntimeError):
        pass

    ip = get_ipython()
    installs = re.compile(
        r"^\\s*(?:sudo\\s+)?(?:(?:\\S*/)?(?:pip3?(?:\\.\\d+)?|(?:\\S*python3?(?:\\.\\d+)?)\\s+-m\\s+pip|conda|mamba|micromamba)"
        r"\\s+(?:install|download)|(?:\\S*/)?uv\\s+(?:pip\\s+(?:install|sync)|add|sync|tool)|"
        r"(?:\\S*/)?(?:npm\\s+(?:install|i|ci|add)|yarn\\s+add|pnpm\\s+(?:add|install)))\\b"
    )

    def refuse_magic(name):
        def magic(line=""):
            if re.match(r"\\s*(install|download|add|sync)\\b", line) or name in ("conda", "mamba"):
                raise InstallFromCodeRefused(f"%{{name}} {{line}}: {{refusal}}")
            return ip.system(f"{{sys.executable}} -m {{name}} {{line}}")
        return magic

    for name in ("pip", "conda", "mamba", "uv"):
        ip.register_magic_function(refuse_magic(name), "line", name)

    shell = ip.system

    def system(cmd):
        for part in re.split(r"&&|\\|\\||;|\\|", cmd):
            if installs.match(part):
                raise InstallFromCodeRefused(f"!{{part.strip()}}: {{refusal}}")
        shell(cmd)
        code = ip.user_ns.get("_exit_code", 0)
        if code:
            sys.stderr.write(f"[!{{cmd}} exited with code {{code}}]\\n")

    ip.system = system
    ip.InstallFromCodeRefused = InstallFromCodeRefused


_kernmind_install_guard()
del _kernmind_install_guard
"""


def write_shims(directory: Path) -> Path:
    """Write the installer shims into ``directory`` (idempotent); return it."""
    directory.mkdir(parents=True, exist_ok=True)
    script = _SHIM.format(refusal=REFUSAL.replace("'", "'\\''"))
    for name in INSTALLERS:
        path = directory / name
        if not path.exists() or path.read_text() != script:
            tmp = directory / f".{name}.tmp"
            tmp.write_text(script)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
    os.chmod(directory, 0o755)
    return directory


SHIMS_MOUNT = "/kernmind/bin"


@dataclass(frozen=True)
class SandboxGuard:
    """What every sandboxed process gets so installs fail fast: the shims and the variables."""

    shims: Mount

    @classmethod
    def create(cls, directory: Path) -> SandboxGuard:
        return cls(Mount(write_shims(directory), SHIMS_MOUNT))

    def environment(self, sandbox: Sandbox, path: str) -> dict[str, str]:
        """The shims first on ``path``; installers that never wait on the network."""
        return {
            "PATH": f"{self.shims.path(sandbox)}:{path}",
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "UV_OFFLINE": "1",
            "npm_config_offline": "true",
            "npm_config_update_notifier": "false",
        }

    def mounts(self) -> list[Mount]:
        return [self.shims]


def activate_layer_code(path: str) -> str:
    """Code that puts a package layer on a running interpreter's path, after its own packages
    (``site.addsitedir`` also runs the layer's ``.pth`` files), and drops import caches."""
    return (
        "def _kernmind_use_packages(path):\n"
        "    import importlib, site\n"
        "    site.addsitedir(path)\n"
        "    importlib.invalidate_caches()\n"
        f"_kernmind_use_packages({path!r})\n"
        "del _kernmind_use_packages\n"
    )

"""The interpreter that runs local kernels, probed once at start, and kernmind's kernelspec.

Design: ``PythonRuntime.probe`` asks the interpreter for its version, ipykernel, read-only
directories and which ``NOTABLE`` packages it has; kernels start from kernmind's own kernelspec.

Error policy: an unusable interpreter gives a runtime whose ``error`` says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KERNEL_NAME = "kernmind-python"


def kernelspec_dir() -> Path:
    """The shipped kernelspec: inside the installed package, or the source tree's ``kernels/``."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "kernels" / KERNEL_NAME, here.parents[4] / "kernels" / KERNEL_NAME):
        if (candidate / "kernel.json").is_file():
            return candidate
    raise FileNotFoundError(f"kernmind's kernelspec {KERNEL_NAME!r} is missing from the installation")


@dataclass(frozen=True)
class PythonRuntime:
    """What we learnt about the interpreter that runs kernels (probed once at start)."""

    executable: str
    version: str
    ipykernel: str | None
    paths: tuple[str, ...]  # directories the sandbox must expose read-only
    error: str | None = None
    pythonpath: tuple[str, ...] = ()  # the server's PYTHONPATH, which kernels on its Python need too
    notable: tuple[str, ...] = ()  # the NOTABLE packages it can import

    @classmethod
    def probe(cls, python: str | None) -> PythonRuntime:
        # Compare paths as given, not resolved: a venv's bin/python is a symlink to its base
        # interpreter but has its own site-packages.
        if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
            # The server's own Python: no subprocess needed (one interpreter start fewer).
            namespace: dict[str, Any] = {}
            exec(_FACTS_SOURCE, namespace)
            extra = tuple(
                p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)
            )
            return cls._from_facts(namespace["facts"](), extra)
        script = _FACTS_SOURCE + "import json\nprint(json.dumps(facts()))\n"
        try:
            # Without our PYTHONPATH: kernels on another interpreter don't get it either.
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            out = subprocess.run(
                [python, "-c", script], capture_output=True, text=True, timeout=60, check=True, env=env
            )
            info = json.loads(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return cls(python, "?", None, (), error=f"cannot run {python}: {exc}")
        return cls._from_facts(info, ())

    @classmethod
    def _from_facts(cls, info: dict[str, Any], pythonpath: tuple[str, ...]) -> PythonRuntime:
        paths = {*info["paths"], *pythonpath}
        dirs = tuple(sorted(p for p in paths if os.path.isdir(p) and p != "/"))
        exe = info["exe"]
        error = None if info["ipykernel"] else f"{exe} has no ipykernel (pip install ipykernel)"
        return cls(
            exe, info["version"], info["ipykernel"], dirs, error, pythonpath, tuple(info.get("notable", []))
        )


# Packages worth naming to a model (run_code's description, doctor): (distribution, module).
NOTABLE = (
    ("numpy", "numpy"),
    ("pandas", "pandas"),
    ("matplotlib", "matplotlib"),
    ("scipy", "scipy"),
    ("scikit-learn", "sklearn"),
    ("statsmodels", "statsmodels"),
    ("seaborn", "seaborn"),
    ("plotly", "plotly"),
    ("pyarrow", "pyarrow"),
    ("openpyxl", "openpyxl"),
    ("sympy", "sympy"),
    ("networkx", "networkx"),
    ("jinja2", "jinja2"),
    ("requests", "requests"),
    ("beautifulsoup4", "bs4"),
    ("pillow", "PIL"),
    ("pyyaml", "yaml"),
    ("torch", "torch"),
)

# Runs in the interpreter being probed (in-process for the server's own Python, else via
# ``python -c``): its version, its ipykernel, the directories the sandbox must expose, and
# which notable packages it can import (found, not imported: that would cost seconds).
_FACTS_SOURCE = f"""\
def facts():
    import os, sys
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec
    try:
        ipykernel = version("ipykernel")
    except PackageNotFoundError:
        ipykernel = None
    paths = {{sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}}
    paths.update(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p))
    notable = []
    for dist, module in {NOTABLE!r}:
        try:
            if find_spec(module) is not None:
                notable.append(dist)
        except (ImportError, ValueError):
            pass
    return {{"exe": sys.executable, "version": sys.version.split()[0], "ipykernel": ipykernel,
            "paths": sorted(paths), "notable": notable}}
"""

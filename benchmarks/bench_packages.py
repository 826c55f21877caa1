"""Package installs and the data-science set, against baselines measured in the same run.

    python benchmarks/bench_packages.py [--packages python-docx tabulate] [--starts 5]

Rows:
- install into a session layer with a cold shared cache (downloads) vs. the same install
  into a *new* session's layer with the warm cache (what "a package any session installed
  before" costs). Sources: the host's index (PyPI by default); with ``--offline`` (or when
  the index cannot be reached) a local PEP 503 index of generated wheels instead.
  Asserts the warm install takes at most 1 s (issue 15's target).
- sandboxed kernel start (to ready + set-up) on the server's interpreter (which has the
  ``datascience`` extra) vs. a baseline interpreter without the packages this round added
  (openpyxl, pyarrow, seaborn, statsmodels, jinja2, plotly, nbformat, sympy, networkx),
  built with uv from the cache; and which of those modules a fresh kernel has imported.
- ``import pandas`` in each interpreter (pandas 3 imports pyarrow when it is installed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import Layer, PackageError, PackageInstaller, PackagePolicy, PackageSources
from kernmind.execution.packages.python import PythonTarget
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox

NEW_DATASCIENCE = (
    "openpyxl",
    "pyarrow",
    "seaborn",
    "statsmodels",
    "jinja2",
    "plotly",
    "nbformat",
    "sympy",
    "networkx",
)
BASELINE = (
    "ipykernel",
    "numpy",
    "pandas",
    "matplotlib",
    "scipy",
    "scikit-learn",
    "requests",
    "beautifulsoup4",
    "PyYAML",
    "Pillow",
)


async def install_rows(installer: PackageInstaller, packages: list[str], root: Path, label: str) -> float:
    cold = await installer.install(packages, "python", Layer(root / "cold").create())
    warm = await installer.install(packages, "python", Layer(root / "warm").create())
    added = ", ".join(f"{p.name} {p.version}" for p in cold.installed)
    print(f"install ({label}): {added}")
    print(f"  cold cache (downloads)            {cold.duration_ms:8.0f} ms")
    print(
        f"  warm cache, new session's layer   {warm.duration_ms:8.0f} ms   ({cold.duration_ms / warm.duration_ms:.1f}x faster)"
    )
    return warm.duration_ms


async def measure_installs(args: argparse.Namespace, sandbox: Sandbox, target: PythonTarget) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-packages-") as tmp:
        root = Path(tmp)
        sources = PackageSources.resolve(None, None, os.environ)
        if not args.offline:
            installer = PackageInstaller(
                PackagePolicy(sources=sources),
                target,
                root / "cache",
                sandbox,
                None,
                PackageInstaller.find_uv(),
                os.environ,
            )
            try:
                warm = await install_rows(installer, args.packages, root / "index", sources.describe())
                assert warm <= 1000, f"a cached install took {warm:.0f} ms (target: at most 1 s)"
                return
            except PackageError as exc:
                print(f"index unreachable ({exc.kind}): falling back to a local index")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "execution"))
        from package_sources import SimpleIndex, make_wheel

        wheels = root / "wheels"
        for i in range(20):
            make_wheel(
                wheels, f"bench-dep{i}", "1.0", modules={f"bench_dep{i}/__init__.py": "X = 1\n" * 2000}
            )
        make_wheel(wheels, "bench-top", "1.0", requires=tuple(f"bench-dep{i}" for i in range(20)))
        with SimpleIndex(wheels).running() as index:
            installer = PackageInstaller(
                PackagePolicy(sources=PackageSources(index.url)),
                target,
                root / "cache",
                sandbox,
                None,
                PackageInstaller.find_uv(),
                {},
            )
            warm = await install_rows(installer, ["bench-top"], root / "local", f"local index, {index.url}")
            assert warm <= 1000, f"a cached install took {warm:.0f} ms (target: at most 1 s)"


async def kernel_starts(sandbox: Sandbox, python: str, n: int) -> tuple[list[float], list[str]]:
    runtime = PythonRuntime.probe(python)
    times: list[float] = []
    imported: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-kernels-") as tmp:
        factory = KernelFactory.standalone(sandbox, runtime, Path(tmp) / "run")
        for _ in range(n):
            t0 = time.perf_counter()
            kernel = await factory.start()
            times.append(time.perf_counter() - t0)
            collector = OutputCollector(10_000)
            probe = f"import sys; sorted(m for m in {NEW_DATASCIENCE!r} if m in sys.modules)"
            await kernel.execute(probe, collector, deadline=time.monotonic() + 30)
            imported = eval(collector.results[0].text) if collector.results else ["?"]
            await kernel.shutdown()
            kernel.workspace.remove()
    return times, imported


def baseline_python(root: Path) -> str | None:
    """A venv with the previous data-science set (no packages added this round)."""
    from uv import find_uv_bin

    uv = find_uv_bin()
    venv = root / "baseline"
    try:
        subprocess.run(
            [uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, capture_output=True
        )
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--compile-bytecode",
                "--python",
                str(venv / "bin" / "python"),
                *BASELINE,
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"baseline interpreter could not be built ({exc}); kernel start has no baseline row")
        return None
    os.chmod(root, 0o755)
    return str(venv / "bin" / "python")


def import_pandas(python: str, n: int = 5) -> float:
    code = "import time; t = time.perf_counter(); import pandas; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(n)
    ]
    return statistics.median(runs) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packages", nargs="+", default=["python-docx", "tabulate"])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--offline", action="store_true", help="use a local index of generated wheels")
    args = parser.parse_args()
    sandbox = Sandbox.detect("auto")
    runtime = PythonRuntime.probe(None)
    await measure_installs(args, sandbox, PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath))

    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        base = baseline_python(Path(tmp))
        rows = [("server's Python ([datascience])", sys.executable)] + (
            [("baseline (without the new packages)", base)] if base else []
        )
        results = {}
        for label, python in rows:
            times, imported = await kernel_starts(sandbox, python, args.starts)
            results[label] = statistics.median(times) * 1000
            print(
                f"kernel start, {label:38s} p50 {results[label]:6.0f} ms (n={len(times)}); new modules imported: {imported or 'none'}"
            )
        if len(results) == 2:
            a, b = results.values()
            print(f"  ratio with/without: {a / b:.2f}")
        for label, python in rows:
            print(f"import pandas, {label:37s} p50 {import_pandas(python):6.0f} ms")


if __name__ == "__main__":
    anyio.run(main)

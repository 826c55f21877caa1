"""Packages and devices for sandboxed code: run-time installs into per-session layers.

- ``installer.PackageInstaller`` — the domain object (``install(packages, language, layer)``);
- ``policy`` — what may be installed and from where (``--packages``, allow-list, sources);
- ``layer`` — a session's install directory; ``stored`` — its copy kept with a stored session;
- ``python`` / ``sdist`` / ``npm`` — the Python (uv), source-build and npm (Deno) paths;
- ``trust`` — which certificate authorities installs trust (system store, ``--ca-file``);
- ``import_names`` — names people import that are published under another (``sklearn``);
- ``diagnose`` — installer failures as sentences a model can act on.
"""

from kernmind.execution.packages.installer import InstalledPackage, InstallResult, PackageInstaller
from kernmind.execution.packages.layer import Distribution, Layer
from kernmind.execution.packages.policy import PackageError, PackagePolicy, PackageSources
from kernmind.execution.packages.python import PythonTarget

__all__ = [
    "Distribution",
    "InstallResult",
    "InstalledPackage",
    "Layer",
    "PackageError",
    "PackageInstaller",
    "PackagePolicy",
    "PackageSources",
    "PythonTarget",
]

"""Run-time installs into per-session layers (docs/tools.md, ``install_packages``): the installer, the policy,
layers and their stored copies, uv, source builds and npm through Deno."""

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

"""Run-time installs into per-session layers (docs/tools.md, ``install_packages``): the installer, the policy,
layers and their stored copies, uv, source builds and npm through Deno."""

from kernmind.execution.packages.installer import InstallResult, PackageInstaller
from kernmind.execution.packages.layer import Layer
from kernmind.execution.packages.policy import PackageError, PackagePolicy, PackageSources
from kernmind.execution.packages.python import PythonTarget

__all__ = [
    "InstallResult",
    "Layer",
    "PackageError",
    "PackageInstaller",
    "PackagePolicy",
    "PackageSources",
    "PythonTarget",
]

"""``PackageInstaller``: install packages into a session's layer, under the operator's policy.

Design: the server installs, never sandboxed code. Python: wheels resolved against what the
interpreter has (``python.py``), with ``--allow-sdist`` a sandboxed source build (``sdist.py``);
JavaScript/TypeScript: npm through Deno (``npm.py``); other languages are refused. A failed
name published under another (``import_names.py``) is retried once. The caller owns the layer
and serialises installs into it, and makes the packages visible to running code.

Error policy: ``PackageError`` with a sentence the model can act on; nothing is added to the
layer when resolution fails.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, Field

from kernmind.config import Settings
from kernmind.execution.packages import import_names, npm, trust
from kernmind.execution.packages.layer import Distribution, Layer
from kernmind.execution.packages.policy import (
    PackageError,
    PackagePolicy,
    PackageSources,
    installer_environment,
    load_allowlist,
    parse_npm,
    parse_python,
)
from kernmind.execution.packages.python import (
    BaseEnvironment,
    CompiledStore,
    HostUv,
    Installed,
    PythonTarget,
    cached_stubs,
    resolve_and_install,
)
from kernmind.execution.packages.sdist import build_in_sandbox
from kernmind.execution.sandbox.bwrap import Sandbox

JS_LANGUAGES = ("javascript", "typescript")
# Failures after which a request for an import name (``sklearn``) is tried under its published name.
RETRIED_WITH_PUBLISHED_NAMES = (
    "policy",
    "not_found",
    "no_wheel",
    "sdist_refused",
    "build_failed",
    "installer",
)


class InstalledPackage(BaseModel):
    name: str
    version: str


class InstallResult(BaseModel):
    language: str
    session_id: str | None = None
    installed: list[InstalledPackage] = Field(
        description="added by this call: what was asked for and the dependencies it needed"
    )
    already_installed: list[InstalledPackage] = Field(
        description="what was asked for and was already there (nothing to do)"
    )
    duration_ms: float
    notes: list[str] = Field(default_factory=list)


def _listing(dists: Sequence[Distribution]) -> list[InstalledPackage]:
    return [InstalledPackage(name=d.name, version=d.version) for d in dists]


@dataclass
class PackageInstaller:
    policy: PackagePolicy
    target: PythonTarget
    cache_dir: Path
    sandbox: Sandbox
    deno: str | None
    uv_binary: str | None  # None: the uv installed beside kernmind, found on first use (``uv``)
    environ: Mapping[str, str]
    timeout: float = 600.0
    ca_file: Path | None = None  # --ca-file: certificate authorities trusted besides the system's

    def __post_init__(self) -> None:
        self.base = BaseEnvironment(self.target)
        self.store = CompiledStore.for_target(self.cache_dir, self.target)

    @functools.cached_property
    def uv(self) -> str:
        """The uv binary (found at the first install, not at start: finding it imports sysconfig)."""
        return self.uv_binary or self.find_uv()

    @functools.cached_property
    def host_env(self) -> dict[str, str]:
        """The installers' variables: the host's proxies and certificates, and the trust of
        ``trust.py`` (made on first use: it asks uv which flag it knows)."""
        try:
            uv_help = subprocess.run([self.uv, "--help"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            uv_help = ""
        return trust.tls_environment(
            installer_environment(self.environ),
            self.environ,
            ca_file=self.ca_file,
            bundle_dir=self.cache_dir / "trust",
            uv_system_certs=trust.uv_knows_system_certs(uv_help),
        )

    @classmethod
    def from_settings(
        cls, settings: Settings, sandbox: Sandbox, target: PythonTarget, environ: Mapping[str, str]
    ) -> PackageInstaller:
        """The installer the server uses (``ValueError`` for an unreadable allow-list)."""
        policy = PackagePolicy(
            mode=settings.packages,
            allowlist=load_allowlist(settings.package_allowlist)
            if settings.package_allowlist
            else frozenset(),
            allow_sdist=settings.allow_sdist,
            sources=PackageSources.resolve(settings.package_index, settings.find_links, environ),
        )
        cache = settings.data_dir.absolute() / "cache" / "packages"
        if settings.ca_file is not None:
            trust.check_ca_file(settings.ca_file)  # refused at start, not at the first install
        return cls(policy, target, cache, sandbox, cls.find_deno(), None, environ, ca_file=settings.ca_file)

    @staticmethod
    def find_uv() -> str:
        from uv import find_uv_bin

        return find_uv_bin()

    @staticmethod
    def find_deno() -> str | None:
        return npm.find_deno()

    async def install(self, packages: Sequence[str], language: str, layer: Layer) -> InstallResult:
        started = time.perf_counter()
        if language == "python":
            installed, already, notes = await self._python(packages, layer)
        elif language in JS_LANGUAGES:
            installed, already, notes = await self._npm(packages, layer), [], []
        elif language in ("r", "java", "bash"):
            raise PackageError(
                "unsupported",
                f"packages cannot be installed for {language}: install_packages supports language='python' "
                "(wheels from the package index) and 'javascript'/'typescript' (npm: packages). "
                f"{language} code can use what is installed on the server"
                + (" (installed.packages() lists R's)." if language == "r" else "."),
            )
        else:
            raise PackageError(
                "invalid", f"unknown language {language!r}: use 'python', 'javascript' or 'typescript'."
            )
        if not installed and not notes:
            notes.append("nothing new was needed: everything asked for was already installed.")
        return InstallResult(
            language=language,
            installed=_listing(installed),
            already_installed=_listing(already),
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
            notes=notes,
        )

    async def _python(
        self, packages: Sequence[str], layer: Layer
    ) -> tuple[list[Distribution], list[Distribution], list[str]]:
        """Install ``packages``; when that fails over a name people import but which is published
        under another (``sklearn``), once more with the published names (``import_names.py``)."""
        requirements = parse_python(packages)
        try:
            installed, already, notes = await self._python_requirements(requirements, layer)
        except PackageError as exc:
            published, replaced = import_names.substitute(requirements)
            about = exc.message.lower()
            if (
                exc.kind not in RETRIED_WITH_PUBLISHED_NAMES
                or self.policy.mode == "none"
                or not any(a.lower() in about or canonicalize_name(a) in about for a in replaced)
            ):
                raise
            try:
                installed, already, notes = await self._python_requirements(published, layer)
            except PackageError as again:
                said = "; ".join(
                    f"{a} is the name you import, published as {d!r}" for a, d in replaced.items()
                )
                raise PackageError(
                    again.kind, f"{said}, and installing that failed too: {again.message}"
                ) from None
            note = import_names.substitution_note(replaced, {d.key for d in installed})
            return installed, already, [note, *notes]
        have = {d.key for d in [*installed, *already]}
        have |= set(await anyio.to_thread.run_sync(layer.python_distributions))
        have |= set(await anyio.to_thread.run_sync(self.base.distributions))
        for req in requirements:
            dist = import_names.published_as(req.name)
            if dist is not None and canonicalize_name(dist) not in have:
                notes.append(import_names.other_project_note(req.name, dist))
        return installed, already, notes

    async def _python_requirements(
        self, requirements: list[Requirement], layer: Layer
    ) -> tuple[list[Distribution], list[Distribution], list[str]]:
        self.policy.check([canonicalize_name(r.name) for r in requirements])
        base = await anyio.to_thread.run_sync(self.base.distributions)
        in_layer = await anyio.to_thread.run_sync(layer.python_distributions)
        stubs = await anyio.to_thread.run_sync(cached_stubs, self.cache_dir, base)
        installed = Installed(base, stubs, in_layer)
        sources, timeout = self.policy.sources, self.timeout
        with tempfile.TemporaryDirectory(prefix="kernmind-install-") as scratch:
            try:
                result = await resolve_and_install(
                    HostUv(self.uv, self.host_env),
                    requirements,
                    target=self.target,
                    installed=installed,
                    sources=sources,
                    install_dir=layer.python,
                    cache_dir=self.cache_dir,
                    scratch=Path(scratch),
                    wheels_only=True,
                    timeout=timeout,
                    store=self.store,
                )
                return result.installed, result.already, []
            except PackageError as exc:
                if exc.kind != "sdist_refused" or not self.policy.allow_sdist:
                    raise
        result, skipped = await build_in_sandbox(
            self.sandbox,
            requirements,
            uv_binary=self.uv,
            target=self.target,
            installed=installed,
            sources=sources,
            layer_dir=layer.python,
            proxy_env=self.host_env,
            timeout=timeout,
        )
        where = "inside the sandbox" if self.sandbox.isolated else "with resource limits only (no sandbox)"
        notes = [f"some packages were built from source {where} (--allow-sdist)."]
        if skipped:
            notes.append(f"{len(skipped)} links or special files from the build were left out: {skipped[:5]}")
        return result.installed, result.already, notes

    async def _npm(self, packages: Sequence[str], layer: Layer) -> list[Distribution]:
        specs = parse_npm(packages)
        self.policy.check([f"npm:{name}" for name, _ in specs])
        if self.deno is None:
            raise PackageError(
                "unsupported",
                "npm packages need Deno, which is not installed on this server (pip install deno).",
            )
        return await npm.prefetch(
            self.deno,
            [s for _, s in specs],
            deno_dir=layer.deno,
            shared_dir=self.cache_dir / "deno",
            host_env=self.host_env,
            timeout=self.timeout,
        )

    def describe(self) -> dict[str, object]:
        try:
            version = subprocess.run(
                [self.uv, "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            version = f"unavailable: {exc}"
        return {
            **self.policy.describe(),
            "installer": version,
            "cache": str(self.cache_dir),
            "npm": "via Deno" if self.deno else "unavailable (no Deno)",
            "proxy": ", ".join(k for k in self.host_env if k.lower().endswith("_proxy")) or "none",
            "trusted certificates": trust.describe(self.host_env, self.ca_file),
        }

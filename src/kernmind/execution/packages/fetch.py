"""Downloading what a source build needs, by the server, so the build itself has no network.

Design (docs/security.md, "Packages"): fills the directory ``sdist.py`` builds from, running
nothing it downloads. Per project, the newest version every requirement seen admits; its
requirements are read, not computed (a wheel's ``METADATA``, an sdist's static ``PKG-INFO`` or
``pyproject.toml``, build requirements); what only a build can tell fails the offline
resolution, and ``missing_projects`` reads those names for another round.

Error policy: ``PackageError`` ("installer") for an unreachable index (naming the URL) or a
hash mismatch; limits on projects and bytes stop a tree that would not end.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
import tomllib
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name
from packaging.version import Version

from kernmind.execution.packages.index_pages import MAX_BYTES, Candidate, get, is_remote, page
from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError, PackageSources

MAX_PROJECTS = 200
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
_MISSING = re.compile(
    r"\b([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the (?:provided package locations|package registry)"
)


@dataclass
class Target:
    """The interpreter the packages are for: its tags and marker environment."""

    version: tuple[int, int]
    tags: frozenset[Tag]
    environment: dict[str, str]

    @classmethod
    def for_version(cls, version: tuple[int, int], environment: Mapping[str, str] | None = None) -> Target:
        tags = frozenset([*cpython_tags(version), *compatible_tags(version)])
        env = dict(environment or default_environment())
        env.setdefault("python_version", f"{version[0]}.{version[1]}")
        return cls(version, tags, env)

    @classmethod
    def probe(cls, executable: str) -> Target:
        """The target interpreter's version and marker environment (it runs on this host, so its
        platform tags are this host's)."""
        out = subprocess.run(
            [executable, "-c", _ENVIRONMENT], capture_output=True, text=True, timeout=60, check=False
        )
        try:
            env = json.loads(out.stdout)
            major, minor = (int(p) for p in env["python_version"].split(".")[:2])
        except (ValueError, KeyError) as exc:
            raise PackageError(
                "installer", f"cannot inspect {executable}: {out.stderr.strip()[-300:]}"
            ) from exc
        return cls.for_version((major, minor), env)


# What packaging.markers.default_environment() computes, in the target interpreter (stdlib only).
_ENVIRONMENT = """
import json, os, platform, sys
impl = sys.implementation
v = impl.version
iv = f"{v.major}.{v.minor}.{v.micro}" + (f"{v.releaselevel[0]}{v.serial}" if v.releaselevel != "final" else "")
print(json.dumps({
    "implementation_name": impl.name, "implementation_version": iv, "os_name": os.name,
    "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}))
"""


@dataclass
class Fetcher:
    """Fills ``directory`` with the distributions ``requirements`` need from remote ``sources``."""

    sources: PackageSources
    target: Target
    installed: Mapping[str, Distribution]
    directory: Path
    proxy_env: Mapping[str, str] = field(default_factory=dict)
    fetched: dict[str, set[Version]] = field(default_factory=dict)
    specs: dict[str, SpecifierSet] = field(default_factory=dict)
    _pages: dict[str, list[Candidate]] = field(default_factory=dict)
    _bytes: int = 0

    def fetch(self, requirements: Iterable[Requirement], *, build: bool = False) -> None:
        """Download what ``requirements`` (and what they need, transitively) need."""
        queue: list[tuple[Requirement, bool]] = [(r, build) for r in requirements]
        while queue:
            req, for_build = queue.pop(0)
            key = canonicalize_name(req.name)
            spec = self.specs.get(key, SpecifierSet()) & req.specifier
            self.specs[key] = spec
            have = self.installed.get(key)
            if (
                not for_build
                and have is not None
                and not req.extras
                and spec.contains(have.version, prereleases=True)
            ):
                continue
            candidates = self._candidates(key)
            chosen = self._choose(key, candidates, spec)
            if chosen is None:
                continue  # the resolver, offline, says what is missing and why
            if chosen in self.fetched.get(key, set()) and not req.extras:
                continue
            if len(self.fetched) >= MAX_PROJECTS and key not in self.fetched:
                raise PackageError(
                    "installer", f"the build needs more than {MAX_PROJECTS} projects; install fewer at once."
                )
            self.fetched.setdefault(key, set()).add(chosen)
            files = [c for c in candidates if c.version == chosen and self._usable(c)]
            for candidate in files:
                self._download(candidate)
            for dep, dep_build in self._needs(files, req.extras):
                queue.append((dep, dep_build))

    # --- listing ----------------------------------------------------------------------------
    def _candidates(self, key: str) -> list[Candidate]:
        if key not in self._pages:
            found: list[Candidate] = []
            for index in [u for u in (self.sources.index_url, *self.sources.extra_index_urls) if u]:
                if is_remote(index):
                    found += page(f"{index.rstrip('/')}/{key}/", key, self.proxy_env)
            for link in self.sources.find_links:
                if is_remote(link):
                    found += page(link, key, self.proxy_env)
            self._pages[key] = found
        return self._pages[key]

    def _choose(self, key: str, candidates: Sequence[Candidate], spec: SpecifierSet) -> Version | None:
        usable = {c.version for c in candidates if self._usable(c)}
        # Pre-releases when a requirement names one, else only when nothing else matches (as resolvers do).
        for pre in (bool(spec.prereleases), True):
            if versions := [v for v in usable if spec.contains(v, prereleases=pre)]:
                return max(versions)
        return None

    def _usable(self, c: Candidate) -> bool:
        py = Version(f"{self.target.version[0]}.{self.target.version[1]}")
        if c.requires_python is not None and not c.requires_python.contains(py, prereleases=True):
            return False
        return c.wheel_tags is None or bool(c.wheel_tags & self.target.tags)

    # --- downloading ------------------------------------------------------------------------------
    def _download(self, c: Candidate) -> None:
        path = self.directory / c.filename
        if path.exists():
            return
        data, _, _ = get(c.url, self.proxy_env)
        if c.sha256 is not None and hashlib.sha256(data).hexdigest() != c.sha256.lower():
            raise PackageError(
                "installer", f"{c.filename} from {c.url} does not match the hash its index gave."
            )
        self._bytes += len(data)
        if self._bytes > MAX_BYTES:
            raise PackageError(
                "installer", f"the build's downloads passed {MAX_BYTES // 2**20} MiB; stopped."
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)

    # --- what a download needs ----------------------------------------------------------------
    def _needs(self, files: Sequence[Candidate], extras: Iterable[str]) -> list[tuple[Requirement, bool]]:
        wanted = {"", *extras}
        out: list[tuple[Requirement, bool]] = []
        for c in files:
            try:
                static = read_requirements(self.directory / c.filename)
            except (OSError, ValueError, tarfile.TarError, zipfile.BadZipFile):
                continue
            runtime, build = static
            for text in runtime or []:
                req = _requirement(text)
                if req is not None and self._applies(req, wanted):
                    out.append((req, False))
            for text in build:
                req = _requirement(text)
                if req is not None and self._applies(req, {""}):
                    out.append((req, True))
        return out

    def _applies(self, req: Requirement, extras: Iterable[str]) -> bool:
        if req.marker is None:
            return True
        return any(req.marker.evaluate({**self.target.environment, "extra": e}) for e in extras)


def read_requirements(path: Path) -> tuple[list[str] | None, list[str]]:
    """(runtime requirements, or None when only a build can tell; build requirements) of a
    downloaded distribution, read from its files (nothing of it runs)."""
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            name = next(
                (n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None
            )
            if name is None:
                return [], []
            meta = HeaderParser().parsestr(zf.read(name).decode("utf-8", "replace"))
            return list(meta.get_all("Requires-Dist") or []), []
    pkg_info = pyproject = None
    with tarfile.open(path) as tf:
        for member in tf.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and member.isfile() and member.size < 4 * 2**20:
                if parts[1] == "PKG-INFO":
                    pkg_info = _read(tf, member)
                elif parts[1] == "pyproject.toml":
                    pyproject = _read(tf, member)
    runtime: list[str] | None = None
    if pkg_info is not None:
        meta = HeaderParser().parsestr(pkg_info)
        dynamic = {d.lower() for d in meta.get_all("Dynamic") or []}
        if _metadata_version(meta.get("Metadata-Version")) >= (2, 2) and "requires-dist" not in dynamic:
            runtime = list(meta.get_all("Requires-Dist") or [])
    build = list(LEGACY_BUILD_REQUIRES)
    if pyproject is not None:
        data = tomllib.loads(pyproject)
        system = data.get("build-system")
        if isinstance(system, dict) and isinstance(system.get("requires"), list):
            build = [str(r) for r in system["requires"]]
        project = data.get("project")
        if runtime is None and isinstance(project, dict) and "dependencies" not in project.get("dynamic", []):
            runtime = [str(r) for r in project.get("dependencies", [])]
            for extra, reqs in (project.get("optional-dependencies") or {}).items():
                runtime += [
                    f"{r}; extra == {extra!r}" if ";" not in r else f"({r}) and extra == {extra!r}"
                    for r in reqs
                ]
    return runtime, build


def missing_projects(message: str) -> list[str]:
    """Names a resolver said it could not find (what an offline build still needs)."""
    return sorted({canonicalize_name(m) for m in _MISSING.findall(message)})


# --- small helpers -----------------------------------------------------------------------------


def _read(tf: tarfile.TarFile, member: tarfile.TarInfo) -> str | None:
    fh = tf.extractfile(member)
    return fh.read().decode("utf-8", "replace") if fh is not None else None


def _metadata_version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "0").split(".")[:2])
    except ValueError:
        return (0,)


def _requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None

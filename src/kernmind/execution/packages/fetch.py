"""Downloading what a source build needs, by the server, so the build itself has no network.

A source build runs the package's own code (its build backend, ``setup.py``). With the
network, that code could reach anything the host reaches — kernmind's own port on
127.0.0.1, a database, the package index. So ``sdist.py`` runs the build in a sandbox
with no network at all, against a local directory of distributions that this module fills
first, from the configured remote sources, without running any code:

- a project's files are listed from each remote index (PEP 503 HTML or PEP 691 JSON; the
  request asks for JSON) and from remote find-links pages;
- the newest version that matches every requirement seen for the project (no
  pre-releases unless a requirement names one; yanked files skipped) is taken: its sdist,
  and its wheels whose tags the target interpreter accepts;
- the dependencies of what was downloaded are read, not computed: a wheel's ``METADATA``;
  an sdist's ``PKG-INFO`` when it declares them statically (metadata 2.2+ without
  ``Dynamic: Requires-Dist``) or ``pyproject.toml``'s ``[project]`` table; and the sdist's
  build requirements (``[build-system] requires``; setuptools and wheel when it has none),
  which are fetched even when the target already has them (a build runs in an isolated
  environment of its own);
- markers are evaluated for the target interpreter; projects the target already has at a
  matching version are not fetched (the resolver keeps them fixed).

A package whose dependencies only its build can tell (dynamic metadata) may need more: the
sandboxed resolution then fails naming what it did not find, and ``missing_projects`` reads
those names so the caller can fetch them and try again. Every file is checked against the
hash its index gave. Local find-links directories need nothing: the sandbox mounts them.

Error policy: an index that cannot be reached or answers nonsense is a ``PackageError``
("installer") saying which URL; a hash that does not match, too; limits on the number of
projects and bytes stop a dependency tree that would not end.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import subprocess
import tarfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from html.parser import HTMLParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError, PackageSources
from kernmind.execution.packages.trust import certificate_refusal

MAX_PROJECTS = 200
MAX_BYTES = 2 * 1024**3
TIMEOUT = 60.0
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_MISSING = re.compile(
    r"\b([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the (?:provided package locations|package registry)"
)


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str
    sha256: str | None
    version: Version
    wheel_tags: frozenset[Tag] | None  # None: an sdist
    requires_python: SpecifierSet | None


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
                if _is_remote(index):
                    found += self._page(f"{index.rstrip('/')}/{key}/", key)
            for link in self.sources.find_links:
                if _is_remote(link):
                    found += self._page(link, key)
            self._pages[key] = found
        return self._pages[key]

    def _page(self, url: str, key: str) -> list[Candidate]:
        try:
            body, content_type, final = self._get(url, accept=_ACCEPT)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise PackageError("installer", f"the package index answered {exc.code} for {url}") from None
        links = _json_links(body) if "json" in content_type else _html_links(body.decode("utf-8", "replace"))
        out = []
        for href, requires_python, yanked in links:
            if yanked:
                continue
            # Relative links keep the index's credentials (the page was fetched without them in the URL).
            base = url if urllib.parse.urlsplit(url).username is not None else final
            candidate = _candidate(urllib.parse.urljoin(base, href), requires_python)
            if candidate is not None and _project_of(candidate.filename) == key:
                out.append(candidate)
        return out

    def _choose(self, key: str, candidates: Sequence[Candidate], spec: SpecifierSet) -> Version | None:
        named = bool(spec.prereleases)  # a requirement that names a pre-release admits them
        versions = sorted(
            {
                c.version
                for c in candidates
                if self._usable(c) and spec.contains(c.version, prereleases=named)
            },
            reverse=True,
        )
        if not versions:  # a pre-release, when nothing else matches (as resolvers do)
            versions = sorted(
                {
                    c.version
                    for c in candidates
                    if self._usable(c) and spec.contains(c.version, prereleases=True)
                },
                reverse=True,
            )
        return versions[0] if versions else None

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
        data, _, _ = self._get(c.url)
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

    def _get(self, url: str, accept: str | None = None) -> tuple[bytes, str, str]:
        headers = {"Accept": accept} if accept else {}
        parts = urllib.parse.urlsplit(url)
        if parts.username is not None:  # an index URL with credentials (user:token@host), as uv takes it
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
        request = urllib.request.Request(url, headers=headers)
        try:
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler(_proxies(self.proxy_env, url)),
                urllib.request.HTTPSHandler(
                    context=_tls_context(self.proxy_env)
                ),  # (a missing CA file: OSError)
            )
            with opener.open(request, timeout=TIMEOUT) as response:
                return (
                    response.read(MAX_BYTES + 1),
                    response.headers.get("Content-Type", ""),
                    response.geturl(),
                )
        except urllib.error.HTTPError:
            raise
        except (OSError, ValueError) as exc:
            refusal = certificate_refusal(str(exc), url)
            raise refusal or PackageError("installer", f"cannot download {url}: {exc}") from None

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


def _is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file:")


def _project_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return canonicalize_name(parse_wheel_filename(filename)[0])
        return canonicalize_name(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _candidate(url: str, requires_python: str | None) -> Candidate | None:
    base, _, fragment = url.partition("#")
    filename = urllib.parse.unquote(base.rsplit("/", 1)[-1])
    sha = dict(p.split("=", 1) for p in fragment.split("&") if "=" in p).get("sha256")
    try:
        if filename.endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(filename)
            wheel_tags: frozenset[Tag] | None = frozenset(tags)
        elif filename.endswith((".tar.gz", ".zip")):
            _, version = parse_sdist_filename(filename)
            wheel_tags = None
        else:
            return None
        spec = SpecifierSet(requires_python) if requires_python else None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion, ValueError):
        return None
    return Candidate(filename, base, sha, version, wheel_tags, spec)


def _json_links(body: bytes) -> list[tuple[str, str | None, bool]]:
    try:
        data = json.loads(body)
    except ValueError:
        return []
    out = []
    for f in data.get("files", []) if isinstance(data, dict) else []:
        if isinstance(f, dict) and isinstance(f.get("url"), str):
            sha = (f.get("hashes") or {}).get("sha256")
            url = f["url"] + (f"#sha256={sha}" if sha and "#" not in f["url"] else "")
            out.append((url, f.get("requires-python"), bool(f.get("yanked"))))
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str | None, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            a = dict(attrs)
            if a.get("href"):
                self.links.append((a["href"] or "", a.get("data-requires-python"), "data-yanked" in a))


def _html_links(text: str) -> list[tuple[str, str | None, bool]]:
    parser = _Links()
    parser.feed(text)
    return parser.links


def _proxies(env: Mapping[str, str], url: str) -> dict[str, str]:
    """The proxies the host's variables name for ``url`` (none for a host ``no_proxy`` lists)."""
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY")
    host = urllib.parse.urlsplit(url).hostname or ""
    if no_proxy and urllib.request.proxy_bypass_environment(host, {"no": no_proxy}):
        return {}
    out = {}
    for scheme in ("http", "https"):
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            out[scheme] = value
    return out


def _tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """What the installers trust (``trust.py``): the bundle or directory they are given, else the system's."""
    cafile, capath = env.get("SSL_CERT_FILE"), env.get("SSL_CERT_DIR")
    context = ssl.create_default_context(cafile=cafile, capath=capath)
    if cafile or capath:
        context.load_default_certs()  # (as uv and Deno do with the system store on)
    return context

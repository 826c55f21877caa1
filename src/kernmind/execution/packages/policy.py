"""What may be installed, and from where: the operator's package policy.

Design
- ``PackagePolicy``: ``--packages any|none|allowlist`` (an allow-list names what a model may
  ask for; dependencies come with them) and ``--allow-sdist``.
- ``PackageSources``: uv does not read pip's configuration, so ``--package-index``,
  ``--find-links`` and the host's ``UV_*``/``PIP_*`` variables are resolved here once.
- ``parse_python``/``parse_npm`` refuse option-like strings, URLs and paths (they would bypass
  the policy and sources).

Error policy: every refusal is a ``PackageError`` saying what to do instead; a broken
allow-list file is a ``ValueError`` at start naming the line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kernmind.refusals import Refusal

PackagesMode = Literal["any", "none", "allowlist"]
Failure = Literal[
    "invalid",
    "policy",
    "unsupported",
    "not_found",
    "no_wheel",
    "sdist_refused",
    "conflict",
    "network",
    "build_failed",
    "timeout",
    "installer",
    "memory",
]

PYPI = "https://pypi.org/simple"
MAX_PACKAGES = 50
MAX_SPEC_CHARS = 200

# Variables the installers may see from the host (everything else is left out).
PASSED_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "UV_NATIVE_TLS",
    "UV_SYSTEM_CERTS",
    "UV_HTTP_TIMEOUT",
    "UV_HTTP_RETRIES",
    "UV_CONCURRENT_DOWNLOADS",
    "NETRC",
    "NPM_CONFIG_REGISTRY",
    "DENO_CERT",
    "DENO_TLS_CA_STORE",
)


class PackageError(Refusal, ValueError):
    """An install that did not happen, with a sentence the model can act on."""

    def __init__(self, kind: Failure, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def installer_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The host variables an installer needs: proxies (either case), certificates, HOME, PATH."""
    # One retry (uv's default is three, with back-off): a dead index fails in about a second.
    env = {
        "PATH": environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "NO_COLOR": "1",
        "UV_HTTP_RETRIES": "1",
    }
    if "HOME" in environ:
        env["HOME"] = environ["HOME"]
    for name in PASSED_VARIABLES:
        for key in (name, name.lower()):
            if key in environ:
                env[key] = environ[key]
    if "SSL_CERT_FILE" not in env and environ.get("PIP_CERT"):
        env["SSL_CERT_FILE"] = environ["PIP_CERT"]  # pip's certificate bundle, for uv too
    return env


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(p for p in re.split(r"[\s,]+", value or "") if p)


@dataclass(frozen=True)
class PackageSources:
    """The index, extra indexes and find-links locations uv is pointed at."""

    index_url: str | None = PYPI  # None: no index at all
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    @classmethod
    def resolve(
        cls, package_index: str | None, find_links: str | None, environ: Mapping[str, str]
    ) -> PackageSources:
        """Flags first, then the host's uv/pip variables, then PyPI."""
        extra: tuple[str, ...] = ()
        if package_index is not None:
            index = None if package_index.strip().lower() == "none" else package_index.strip()
        else:
            index = next(
                (
                    environ[k]
                    for k in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")
                    if environ.get(k, "").strip()
                ),
                PYPI,
            ).strip()
            extra = _split(environ.get("UV_EXTRA_INDEX_URL")) + _split(environ.get("PIP_EXTRA_INDEX_URL"))
        if find_links is not None:
            links: tuple[str, ...] = (find_links,)
        else:
            links = _split(environ.get("UV_FIND_LINKS") or environ.get("PIP_FIND_LINKS"))
        links = tuple(link if "://" in link else os.path.abspath(link) for link in links)
        return cls(index, tuple(dict.fromkeys(extra)), links)

    @property
    def uv_args(self) -> list[str]:
        args = ["--no-index"] if self.index_url is None else ["--index-url", self.index_url]
        if self.index_url is not None:
            for url in self.extra_index_urls:
                args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args

    @property
    def local_dirs(self) -> list[str]:
        """find-links directories (a sandboxed installer must be able to read them)."""
        return [link for link in self.find_links if "://" not in link]

    @property
    def remote(self) -> bool:
        """True when installing may need the network."""
        urls = [*([self.index_url] if self.index_url else []), *self.extra_index_urls, *self.find_links]
        return any(not url.startswith("file:") and "://" in url for url in urls)

    def describe(self) -> str:
        parts = [f"index {self.index_url}" if self.index_url else "no index"]
        parts += [f"extra index {u}" for u in self.extra_index_urls]
        parts += [f"find-links {link}" for link in self.find_links]
        return ", ".join(parts)


def load_allowlist(path: Path) -> frozenset[str]:
    """Normalised entries of an allow-list file (``ValueError`` naming the bad line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the package allow-list {path}: {exc.strerror or exc}") from exc
    entries: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("npm:"):
            name = line[4:].lower()
            if not _NPM_NAME.fullmatch(name):
                raise ValueError(f"{path}:{number}: {line!r} is not an npm package name")
            entries.add("npm:" + name)
        elif re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", line):
            entries.add(canonicalize_name(line))
        else:
            raise ValueError(
                f"{path}:{number}: {line!r} is not a package name (one name a line; npm packages as npm:name)"
            )
    return frozenset(entries)


@dataclass(frozen=True)
class PackagePolicy:
    mode: PackagesMode = "any"
    allowlist: frozenset[str] = frozenset()
    allow_sdist: bool = False
    sources: PackageSources = field(default_factory=PackageSources)

    def check(self, keys: Sequence[str]) -> None:
        """Refuse unless every requested package (``name`` or ``npm:name``) may be installed."""
        if self.mode == "none":
            raise PackageError(
                "policy",
                "installing packages is turned off on this server (--packages none); "
                "use the packages that are already installed.",
            )
        if self.mode == "allowlist":
            refused = [k for k in keys if k not in self.allowlist]
            if refused:
                allowed = sorted(self.allowlist)
                shown = ", ".join(allowed[:40]) + (
                    f", … ({len(allowed)} in all)" if len(allowed) > 40 else ""
                )
                raise PackageError(
                    "policy",
                    f"not on this server's package allow-list: {', '.join(refused)}. "
                    f"Allowed: {shown or 'nothing'}.",
                )

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "sources": self.sources.describe(),
            "sdist": "built inside the sandbox" if self.allow_sdist else "refused (wheels only)",
        }
        if self.mode == "allowlist":
            out["allowlist"] = sorted(self.allowlist)
        return out


# --- requests -------------------------------------------------------------------------------
_NPM_NAME = re.compile(r"(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*")
_NPM_RANGE = re.compile(r"[0-9A-Za-z.^~<>=*|+ -]{1,64}")


def _check_shape(specs: Sequence[str]) -> None:
    if not specs:
        raise PackageError("invalid", 'no packages given: pass a list such as ["openpyxl", "pyarrow>=15"].')
    if len(specs) > MAX_PACKAGES:
        raise PackageError(
            "invalid", f"{len(specs)} packages in one call; install at most {MAX_PACKAGES} at a time."
        )
    for spec in specs:
        if len(spec) > MAX_SPEC_CHARS:
            raise PackageError(
                "invalid", f"a package specifier is {len(spec)} characters long (at most {MAX_SPEC_CHARS})."
            )


def parse_python(specs: Sequence[str]) -> list[Requirement]:
    """PEP 508 requirements by name (``pandas``, ``pyarrow>=15``, ``seaborn[stats]``)."""
    _check_shape(specs)
    out: list[Requirement] = []
    for raw in specs:
        spec = raw.strip()
        if spec.startswith("-"):
            raise PackageError(
                "invalid",
                f"{spec!r} looks like a command-line option; give package names or requirement "
                "specifiers such as 'openpyxl' or 'pyarrow>=15'.",
            )
        if spec.startswith(("npm:", "jsr:")):
            raise PackageError(
                "invalid",
                f"{spec!r} is a JavaScript package: call install_packages with language='javascript'.",
            )
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            hint = (
                " (pip options, URLs and file paths are not accepted)" if "/" in spec or " " in spec else ""
            )
            raise PackageError("invalid", f"{spec!r} is not a valid requirement{hint}: {exc}") from None
        if req.url:
            raise PackageError(
                "invalid",
                f"{spec!r} names a URL; install packages by name from the configured index "
                "(direct URLs and paths would bypass the server's package policy).",
            )
        out.append(req)
    return out


def parse_npm(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, "npm:name@range")`` for ``npm:lodash@4``, ``lodash``, ``@scope/pkg@^1``."""
    _check_shape(specs)
    out: list[tuple[str, str]] = []
    for raw in specs:
        spec = raw.strip()
        if spec.startswith(("jsr:", "http:", "https:", "file:", "git")) or spec.startswith("."):
            raise PackageError(
                "unsupported",
                f"{spec!r}: only npm packages can be installed for JavaScript/TypeScript "
                "(write them as npm:name or npm:name@version).",
            )
        body = spec.removeprefix("npm:")
        at = body.find("@", 1)  # a leading @ is a scope
        name, version = (body, "") if at < 0 else (body[:at], body[at + 1 :])
        if not _NPM_NAME.fullmatch(name) or (version and not _NPM_RANGE.fullmatch(version)):
            raise PackageError(
                "invalid",
                f"{spec!r} is not an npm package specifier; write npm:name, npm:name@4 or npm:@scope/name@^1.2.",
            )
        out.append((name, f"npm:{name}@{version}" if version else f"npm:{name}"))
    return out

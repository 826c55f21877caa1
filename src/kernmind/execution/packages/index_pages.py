"""A remote package index, read without running anything: its pages' files, and downloads.

Design: PEP 503 HTML or PEP 691 JSON pages (JSON asked for), yanked files skipped, each file's
hash kept for the download's check; relative links keep the index URL's credentials; proxies
and trusted certificates are the installers' (``trust.py``), as uv and Deno get them.

Error policy: an index that cannot be reached is a ``PackageError`` ("installer") naming the
URL (an untrusted certificate: ``trust.certificate_refusal``'s sentence); a 404 page lists
nothing; a page or filename that makes no sense is skipped.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from kernmind.execution.packages.policy import PackageError
from kernmind.execution.packages.trust import certificate_refusal

MAX_BYTES = 2 * 1024**3
TIMEOUT = 60.0
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str
    sha256: str | None
    version: Version
    wheel_tags: frozenset[Tag] | None  # None: an sdist
    requires_python: SpecifierSet | None


def page(url: str, key: str, env: Mapping[str, str]) -> list[Candidate]:
    """The usable-looking files of project ``key`` an index or find-links page at ``url`` lists."""
    try:
        body, content_type, final = get(url, env, accept=_ACCEPT)
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


def get(url: str, env: Mapping[str, str], accept: str | None = None) -> tuple[bytes, str, str]:
    """The body, content type and final URL of ``url``, through the proxies and trust of ``env``."""
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
            urllib.request.ProxyHandler(_proxies(env, url)),
            urllib.request.HTTPSHandler(context=_tls_context(env)),  # (a missing CA file: OSError)
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


def is_remote(url: str) -> bool:
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

"""Package sources the package tests serve themselves, with no internet.

- ``make_wheel``: a real, installable wheel built here (a zip with the package's modules,
  ``METADATA``, ``WHEEL`` and a ``RECORD`` with sha256 hashes), as ``pip wheel`` would make.
- ``make_sdist``: a real sdist whose build backend is in the archive itself
  (``backend-path``), so building it needs no setuptools and no network. Building it
  leaves a marker file naming the uid and network namespace it ran in, so a test can
  tell where the build ran.
- ``SimpleIndex``: a PEP 503 "simple" index over a directory of distributions, served
  by ``http.server`` on 127.0.0.1 in a thread, with PyPI's caching headers; it records
  the requests it answered.
- ``NpmRegistry``: the two endpoints of the npm registry protocol Deno uses (a package's
  "packument" JSON and its tarball), served on 127.0.0.1.

Both serve HTTPS when given ``tls`` (``tls_sources.PrivateCA`` makes a certificate authority
and a server certificate for 127.0.0.1, as a company proxy or private index has).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import json
import re
import ssl
import tarfile
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    extras: tuple[str, ...] = (),
    modules: dict[str, str] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """Build ``name-version-tag.whl`` in ``directory``; by default one module ``name`` whose
    ``VERSION`` is ``version``."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    modules = modules or {f"{dist}/__init__.py": f"VERSION = {version!r}\n"}
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Provides-Extra: {e}\n" for e in extras)
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: kernmind-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    files = {**modules, f"{info}/METADATA": metadata, f"{info}/WHEEL": wheel_meta}
    path = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        records = []
        for arcname, text in files.items():
            data = text.encode()
            zf.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return path


# An in-tree PEP 517 backend: writes a wheel with zipfile, and a marker saying where it ran.
_BACKEND = """\
import base64, hashlib, os, zipfile

NAME, VERSION = {name!r}, {version!r}
DIST = NAME.replace("-", "_")
CONNECT = {connect!r}  # a 127.0.0.1 port a hostile build tries to reach (None: it does not try)
REQUIRES = "".join("Requires-Dist: %s\\n" % r for r in {requires!r})


def _reach():
    if CONNECT is None:
        return None
    import socket
    try:
        socket.create_connection(("127.0.0.1", CONNECT), timeout=5).close()
        return "connected"
    except OSError as exc:
        return "refused: %s" % exc


def _where():
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = "?"
    return "uid=%d netns=%s" % (os.getuid(), netns)


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, DIST + "-" + VERSION + ".dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n%s" % (NAME, VERSION, REQUIRES))
    return os.path.basename(info)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    exec({build_code!r}, {{}})  # what a test's build does besides (hog memory…)
    info = DIST + "-" + VERSION + ".dist-info"
    files = {{
        DIST + "/__init__.py": "VERSION = %r\\nBUILT = %r\\nREACHED = %r\\n" % (VERSION, _where(), _reach()),
        info + "/METADATA": "Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n%s" % (NAME, VERSION, REQUIRES),
        info + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: in-tree\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    name = DIST + "-" + VERSION + "-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for arc, text in files.items():
            data = text.encode()
            zf.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        records.append(info + "/RECORD,,")
        zf.writestr(info + "/RECORD", "\\n".join(records) + "\\n")
    return name
"""


def make_sdist(
    directory: Path,
    name: str,
    version: str,
    *,
    connect: int | None = None,
    requires: tuple[str, ...] = (),
    dynamic: bool = False,
    build_code: str = "",
) -> Path:
    """Build ``name-version.tar.gz``: an sdist with an in-tree build backend (no build deps);
    with ``connect``, its build tries to reach that port on 127.0.0.1 (``REACHED`` says how it went).
    ``requires`` are its dependencies, declared in ``pyproject.toml`` or, ``dynamic``, known only
    once its backend runs (as a ``setup.py`` package's). ``build_code`` runs when its wheel is built."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    root = f"{dist}-{version}"
    deps = (
        'dynamic = ["dependencies"]\n'
        if dynamic
        else f"dependencies = {list(requires)!r}\n".replace("'", '"')
    )
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n{deps}'
        ),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        "backend.py": _BACKEND.format(
            name=name, version=version, connect=connect, requires=requires, build_code=build_code
        ),
    }
    path = directory / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{root}/{rel}")
            member.size = len(data)
            member.mode = 0o644
            tf.addfile(member, io.BytesIO(data))
    return path


def _dist_name(filename: str) -> str:
    stem = filename.removesuffix(".tar.gz").removesuffix(".whl")
    return normalize(stem.split("-")[0])


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 run in a daemon thread (HTTPS with ``tls``)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def reply(self, status: int, body: bytes, content_type: str, cache: str = "no-cache") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", cache)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        raise NotImplementedError


class SimpleIndex:
    """``/simple/<project>/`` pages (PEP 503) and ``/files/<file>`` over ``directory``."""

    def __init__(self, directory: Path, tls: ssl.SSLContext | None = None) -> None:
        self.directory = directory
        index = self

        class Handler(_Handler):
            def do_GET(self) -> None:
                index.server.requests.append(self.path)
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if parts[:1] == ["files"] and len(parts) == 2:
                    target = index.directory / parts[1]
                    if target.is_file():  # as PyPI serves files: cacheable for ever
                        data = target.read_bytes()
                        return self.reply(
                            200, data, "application/octet-stream", "max-age=365000000, immutable"
                        )
                elif parts[:1] == ["simple"] and len(parts) == 2:
                    files = [p for p in sorted(index.directory.iterdir()) if _dist_name(p.name) == parts[1]]
                    if files:
                        links = "".join(
                            f'<a href="/files/{html.escape(p.name)}#sha256='
                            f'{hashlib.sha256(p.read_bytes()).hexdigest()}">{html.escape(p.name)}</a><br>\n'
                            for p in files
                        )
                        body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
                        return self.reply(200, body, "text/html", "max-age=600")
                self.reply(404, b"not found", "text/plain")

        self.server = _Server(Handler, tls)

    @property
    def url(self) -> str:
        return f"{self.server.url}/simple"

    @property
    def requests(self) -> list[str]:
        return self.server.requests

    @contextlib.contextmanager
    def running(self) -> Iterator[SimpleIndex]:
        self.server.thread.start()
        try:
            yield self
        finally:
            self.server.close()


def make_npm_tarball(name: str, version: str, main_source: str) -> bytes:
    """An npm package tarball: ``package/package.json`` and ``package/index.js``."""
    files = {
        "package/package.json": json.dumps({"name": name, "version": version, "main": "index.js"}),
        "package/index.js": main_source,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(rel)
            member.size = len(data)
            member.mode = 0o644
            tf.addfile(member, io.BytesIO(data))
    return buf.getvalue()


class NpmRegistry:
    """A registry with the given packages: ``{name: {version: index.js source}}``."""

    def __init__(self, packages: dict[str, dict[str, str]], tls: ssl.SSLContext | None = None) -> None:
        self.tarballs = {
            (name, version): make_npm_tarball(name, version, source)
            for name, versions in packages.items()
            for version, source in versions.items()
        }
        registry = self

        class Handler(_Handler):
            def do_GET(self) -> None:
                registry.server.requests.append(self.path)
                path = urllib.parse.unquote(self.path.split("?")[0]).strip("/")
                if "/-/" in path:
                    name, filename = path.split("/-/", 1)
                    version = filename.removeprefix(f"{name.rsplit('/', 1)[-1]}-").removesuffix(".tgz")
                    data = registry.tarballs.get((name, version))
                    if data is not None:
                        return self.reply(200, data, "application/octet-stream")
                else:
                    body = registry.packument(path)
                    if body is not None:
                        return self.reply(200, body, "application/json")
                self.reply(404, b'{"error":"Not found"}', "application/json")

        self.server = _Server(Handler, tls)

    def packument(self, name: str) -> bytes | None:
        versions = sorted(v for (n, v) in self.tarballs if n == name)
        if not versions:
            return None
        doc = {
            "name": name,
            "dist-tags": {"latest": versions[-1]},
            "versions": {
                v: {
                    "name": name,
                    "version": v,
                    "main": "index.js",
                    "dist": {
                        "tarball": f"{self.url}/{name}/-/{name.rsplit('/', 1)[-1]}-{v}.tgz",
                        "shasum": hashlib.sha1(self.tarballs[(name, v)]).hexdigest(),
                        "integrity": "sha512-"
                        + base64.b64encode(hashlib.sha512(self.tarballs[(name, v)]).digest()).decode(),
                    },
                }
                for v in versions
            },
        }
        return json.dumps(doc).encode()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def requests(self) -> list[str]:
        return self.server.requests

    @contextlib.contextmanager
    def running(self) -> Iterator[NpmRegistry]:
        self.server.thread.start()
        try:
            yield self
        finally:
            self.server.close()

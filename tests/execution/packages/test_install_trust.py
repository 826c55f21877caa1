"""Installs work where the user's machine works: a private CA, as behind a company proxy.

A wheelhouse index and an npm registry are served over HTTPS on 127.0.0.1 with a certificate
signed by a certificate authority the test makes (``tls_sources.PrivateCA``). Real uv and Deno
fetch from them: told about the CA (``--ca-file``, ``SSL_CERT_FILE``, ``SSL_CERT_DIR``) they
install; not told, the refusal names the certificate problem and the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from mcp import Client
from packaging.requirements import Requirement

from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import (
    Layer,
    PackageError,
    PackageInstaller,
    PackageSources,
    PythonTarget,
    trust,
)
from kernmind.execution.packages.fetch import Fetcher, Target
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured
from tests.execution.packages.package_sources import NpmRegistry, SimpleIndex, make_wheel
from tests.execution.packages.test_packages import make_installer
from tests.execution.packages.tls_sources import PrivateCA

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages"), pytest.mark.slow]

LEFTPAD = "module.exports = (s, n) => String(s).padStart(n, '.');"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> PrivateCA:
    return PrivateCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, ca: PrivateCA) -> Iterator[SimpleIndex]:
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "alpha", "1.0", requires=("beta>=1",))
    make_wheel(wheels, "beta", "2.0")
    with SimpleIndex(wheels, tls=ca.server_context()).running() as served:
        yield served


@pytest.fixture(scope="module")
def registry(ca: PrivateCA) -> Iterator[NpmRegistry]:
    with NpmRegistry({"leftpad": {"1.0.0": LEFTPAD}}, tls=ca.server_context()).running() as served:
        yield served


def installer(
    index: SimpleIndex, cache: Path, environ: Mapping[str, str] = {}, ca_file: Path | None = None
) -> PackageInstaller:
    runtime = PythonRuntime.probe(None)
    target = PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath)
    host = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **environ}
    return make_installer(
        Sandbox.detect("auto"), target, cache, PackageSources(index.url), environ=host, ca_file=ca_file
    )


def imports(layer: Layer, statement: str) -> str:
    code = f"import sys; sys.path.append({str(layer.python)!r}); {statement}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def assert_names_the_certificate_and_the_fix(message: str) -> None:
    assert "UnknownIssuer" in message, message  # the cause, as uv and Deno say it
    assert "--ca-file" in message and "SSL_CERT_FILE" in message and "env block" in message


# --- Python (uv) -------------------------------------------------------------------------------
async def test_an_untrusted_index_is_refused_naming_the_certificate_and_the_fix(
    index: SimpleIndex, tmp_path: Path
) -> None:
    layer = Layer(tmp_path / "layer").create()
    with pytest.raises(PackageError) as caught:
        await installer(index, tmp_path / "cache").install(["alpha"], "python", layer)
    assert caught.value.kind == "network"
    assert_names_the_certificate_and_the_fix(caught.value.message)
    assert index.url in caught.value.message
    assert layer.python_distributions() == {}


async def test_ca_file_makes_the_index_trusted(index: SimpleIndex, ca: PrivateCA, tmp_path: Path) -> None:
    layer = Layer(tmp_path / "layer").create()
    result = await installer(index, tmp_path / "cache", ca_file=ca.ca_file).install(
        ["alpha"], "python", layer
    )
    assert {p.name: p.version for p in result.installed} == {"alpha": "1.0", "beta": "2.0"}
    assert imports(layer, "import alpha, beta; print(alpha.VERSION)").strip() == "1.0"


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "SSL_CERT_DIR"])
async def test_the_hosts_certificate_variables_are_honoured(
    index: SimpleIndex, ca: PrivateCA, tmp_path: Path, variable: str
) -> None:
    value = str(ca.ca_file if variable == "SSL_CERT_FILE" else ca.ca_file.parent)
    layer = Layer(tmp_path / "layer").create()
    result = await installer(index, tmp_path / "cache", {variable: value}).install(["beta"], "python", layer)
    assert [p.name for p in result.installed] == ["beta"]


# --- npm (Deno) --------------------------------------------------------------------------------
@pytest.mark.skipif(PackageInstaller.find_deno() is None, reason="Deno is not installed")
async def test_npm_from_a_registry_signed_by_a_private_ca(
    index: SimpleIndex, registry: NpmRegistry, ca: PrivateCA, tmp_path: Path
) -> None:
    environ = {"NPM_CONFIG_REGISTRY": f"{registry.url}/"}
    with pytest.raises(PackageError) as caught:
        await installer(index, tmp_path / "c1", environ).install(
            ["npm:leftpad@1"], "javascript", Layer(tmp_path / "l1").create()
        )
    assert caught.value.kind == "network"
    assert_names_the_certificate_and_the_fix(caught.value.message)
    trusted = installer(index, tmp_path / "c2", environ, ca_file=ca.ca_file)
    result = await trusted.install(["npm:leftpad@1"], "javascript", Layer(tmp_path / "l2").create())
    assert [(p.name, p.version) for p in result.installed] == [("leftpad", "1.0.0")]


# --- the server's own downloads (--allow-sdist) ------------------------------------------------
def test_the_servers_own_downloads_trust_the_same(index: SimpleIndex, ca: PrivateCA, tmp_path: Path) -> None:
    def fetcher(env: dict[str, str], name: str) -> Fetcher:
        return Fetcher(
            PackageSources(index.url), Target.for_version((3, 11)), {}, tmp_path / name, proxy_env=env
        )

    with pytest.raises(PackageError) as caught:
        fetcher({}, "untrusted").fetch([Requirement("beta")])
    assert "does not trust" in caught.value.message and "--ca-file" in caught.value.message
    bundle = trust.tls_environment({}, {}, ca_file=ca.ca_file, bundle_dir=tmp_path / "trust")
    fetcher(bundle, "trusted").fetch([Requirement("beta")])
    assert [p.name for p in (tmp_path / "trusted").iterdir()] == ["beta-2.0-py3-none-any.whl"]


# --- the trust in force ------------------------------------------------------------------------
def test_trust_adds_the_ca_to_the_system_store_and_respects_the_hosts_choices(
    ca: PrivateCA, tmp_path: Path
) -> None:
    env = trust.tls_environment({}, {}, ca_file=ca.ca_file, bundle_dir=tmp_path)
    assert env["UV_SYSTEM_CERTS"] == "1" and env["DENO_TLS_CA_STORE"] == "system,mozilla"
    bundle = Path(env["SSL_CERT_FILE"]).read_bytes()
    assert bundle.endswith(ca.ca_file.read_bytes())
    system = trust.system_bundle()
    if system is not None:  # the machine's CAs stay trusted: public indexes keep working
        assert bundle.startswith(system.read_bytes().rstrip(b"\n"))
    assert env["DENO_CERT"] == env["SSL_CERT_FILE"]
    host = {"UV_NATIVE_TLS": "0", "DENO_TLS_CA_STORE": "mozilla"}
    chosen = trust.tls_environment({"DENO_TLS_CA_STORE": "mozilla"}, host, ca_file=None, bundle_dir=tmp_path)
    assert "UV_SYSTEM_CERTS" not in chosen and chosen["DENO_TLS_CA_STORE"] == "mozilla"
    assert "SSL_CERT_FILE" not in chosen


def test_doctor_says_what_installs_trust(index: SimpleIndex, ca: PrivateCA, tmp_path: Path) -> None:
    described = installer(index, tmp_path / "cache", ca_file=ca.ca_file).describe()
    assert described["trusted certificates"] == f"the system trust store + --ca-file {ca.ca_file}"
    plain = installer(index, tmp_path / "cache", {"SSL_CERT_DIR": "/etc/corp/certs"}).describe()
    assert plain["trusted certificates"] == "the system trust store + SSL_CERT_DIR /etc/corp/certs"


def test_a_ca_file_that_is_no_certificate_is_refused_at_start(tmp_path: Path) -> None:
    junk = tmp_path / "ca.der"
    junk.write_bytes(b"\x30\x82\x01\x0a not pem")
    with pytest.raises(ValueError, match=r"--ca-file .*ca.der: no PEM certificate"):
        create_server(make_settings(tmp_path / "server", pool_size=0, ca_file=junk))
    with pytest.raises(ValueError, match=r"--ca-file .*missing.pem: cannot read it"):
        trust.check_ca_file(tmp_path / "missing.pem")


# --- through the MCP server ----------------------------------------------------------------------
async def test_install_packages_with_ca_file_and_without(
    index: SimpleIndex, ca: PrivateCA, tmp_path: Path
) -> None:
    plain = make_settings(tmp_path / "plain", pool_size=0, package_index=index.url)
    async with Client(create_server(plain)) as client:
        refused = error_text(await client.call_tool("install_packages", {"packages": ["beta"]}))
    assert_names_the_certificate_and_the_fix(refused)
    trusted = make_settings(tmp_path / "trusted", pool_size=0, package_index=index.url, ca_file=ca.ca_file)
    async with Client(create_server(trusted)) as client:
        out = structured(await client.call_tool("install_packages", {"packages": ["beta"]}))
    assert [p["name"] for p in out["installed"]] == ["beta"]

"""Where packages come from and which host variables the installer sees.

uv does not read pip's configuration files, so the host's pip/uv variables are read by
kernmind and passed on explicitly; flags beat variables, variables beat PyPI.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernmind.config import Settings
from kernmind.execution.packages.policy import PYPI, PackageSources, installer_environment


def test_flags_beat_host_variables_which_beat_pypi() -> None:
    env = {"PIP_INDEX_URL": "https://pip.example/simple", "UV_INDEX_URL": "https://uv.example/simple"}
    assert PackageSources.resolve(None, None, {}).index_url == PYPI
    assert PackageSources.resolve(None, None, {"PIP_INDEX_URL": "https://pip.example/simple"}).index_url == (
        "https://pip.example/simple"
    )
    assert PackageSources.resolve(None, None, env).index_url == "https://uv.example/simple"
    assert (
        PackageSources.resolve("https://flag.example/simple", None, env).index_url
        == "https://flag.example/simple"
    )


def test_index_none_means_find_links_only() -> None:
    sources = PackageSources.resolve("none", "/srv/wheels", {"PIP_EXTRA_INDEX_URL": "https://extra.example"})
    assert sources.index_url is None and sources.extra_index_urls == ()
    assert sources.uv_args == ["--no-index", "--find-links", "/srv/wheels"]
    assert not sources.remote and sources.local_dirs == ["/srv/wheels"]


def test_extra_indexes_and_find_links_from_the_host() -> None:
    sources = PackageSources.resolve(
        None,
        None,
        {"PIP_EXTRA_INDEX_URL": "https://a.example https://b.example", "PIP_FIND_LINKS": "wheels"},
    )
    assert sources.extra_index_urls == ("https://a.example", "https://b.example")
    assert sources.find_links[0].endswith("/wheels") and sources.find_links[0].startswith("/")
    assert sources.uv_args[:4] == ["--index-url", PYPI, "--extra-index-url", "https://a.example"]
    assert sources.remote


def test_installer_sees_proxies_and_certificates_but_not_the_rest() -> None:
    env = installer_environment(
        {
            "HTTPS_PROXY": "http://proxy:3128",
            "no_proxy": "localhost",
            "PIP_CERT": "/etc/corp-ca.pem",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "PATH": "/usr/bin",
        }
    )
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and env["no_proxy"] == "localhost"
    assert env["SSL_CERT_FILE"] == "/etc/corp-ca.pem"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["NO_COLOR"] == "1"


def test_an_allowlist_policy_needs_its_file() -> None:
    with pytest.raises(ValidationError, match="--packages allowlist needs --package-allowlist FILE"):
        Settings(packages="allowlist")

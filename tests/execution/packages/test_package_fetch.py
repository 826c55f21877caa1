"""What the server downloads for an offline source build (``packages/fetch.py``), from a real local index.

Nothing of a downloaded distribution runs: dependencies are read from its files (a wheel's
METADATA, an sdist's PKG-INFO or pyproject.toml); what only a build can tell is left to the
offline resolution, whose "not found" names are read back.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kernmind.execution.packages.fetch import Fetcher, Target, missing_projects, read_requirements
from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError, PackageSources
from tests.execution.packages.package_sources import SimpleIndex, make_sdist, make_wheel

TARGET = Target.for_version((3, 11))


def sdist_with(path: Path, files: dict[str, str]) -> Path:
    root = path.name.removesuffix(".tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{root}/{rel}")
            member.size = len(data)
            tf.addfile(member, io.BytesIO(data))
    return path


def test_dependencies_are_read_from_the_files_not_computed(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "w", "1.0", requires=("a>=1", 'b; extra == "x"'))
    assert read_requirements(wheel) == (["a>=1", 'b; extra == "x"'], [])
    static = sdist_with(
        tmp_path / "s-1.0.tar.gz",
        {"PKG-INFO": "Metadata-Version: 2.2\nName: s\nVersion: 1.0\nRequires-Dist: c<2\n",
         "pyproject.toml": '[build-system]\nrequires = ["flit_core>=3"]\nbuild-backend = "flit_core.buildapi"\n'},
    )  # fmt: skip
    assert read_requirements(static) == (["c<2"], ["flit_core>=3"])
    dynamic = sdist_with(
        tmp_path / "d-1.0.tar.gz",
        {"PKG-INFO": "Metadata-Version: 2.2\nName: d\nVersion: 1.0\nDynamic: Requires-Dist\n"},
    )
    assert read_requirements(dynamic) == (None, ["setuptools>=40.8.0", "wheel"])  # a setup.py package
    declared = make_sdist(tmp_path, "p", "1.0", requires=("e>=2",))
    assert read_requirements(declared) == (["e>=2"], [])


def test_missing_names_are_read_from_the_resolvers_message() -> None:
    message = (
        "  × No solution found when resolving dependencies:\n"
        "  ╰─▶ Because epsilon was not found in the provided package locations and dynamic-deps==2.0 "
        "depends on epsilon>=1, we can conclude that dynamic-deps==2.0 cannot be used.\n"
        "      And because Zeta_Pkg was not found in the package registry, ..."
    )
    assert missing_projects(message) == ["epsilon", "zeta-pkg"]


@pytest.fixture
def index_files(tmp_path: Path) -> Path:
    d = tmp_path / "files"
    make_wheel(d, "alpha", "1.0", requires=("beta>=1",))
    make_wheel(d, "alpha", "2.0rc1", requires=("beta>=1",))
    make_wheel(d, "beta", "1.0")
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "beta", "3.0", tag="cp27-cp27m-win32")  # not for this interpreter
    make_wheel(d, "gamma", "1.0", requires=('beta<2; python_version < "3"',))  # a marker that is false
    return d


def fetcher(index: SimpleIndex, directory: Path, installed: dict[str, Distribution] | None = None) -> Fetcher:
    return Fetcher(PackageSources(index.url, (), ()), TARGET, installed or {}, directory)


def test_the_newest_usable_versions_are_fetched_with_what_they_declare(
    index_files: Path, tmp_path: Path
) -> None:
    out = tmp_path / "downloads"
    with SimpleIndex(index_files).running() as index:
        fetcher(index, out).fetch([Requirement("alpha"), Requirement("gamma")])
    # No pre-release, no wheel for another platform, no dependency behind a false marker.
    assert sorted(p.name for p in out.iterdir()) == [
        "alpha-1.0-py3-none-any.whl",
        "beta-2.0-py3-none-any.whl",
        "gamma-1.0-py3-none-any.whl",
    ]


def test_what_the_target_has_is_not_fetched_unless_a_build_needs_it(
    index_files: Path, tmp_path: Path
) -> None:
    out = tmp_path / "downloads"
    installed = {"beta": Distribution("beta", "1.0")}
    with SimpleIndex(index_files).running() as index:
        f = fetcher(index, out, installed)
        f.fetch([Requirement("alpha")])
        assert sorted(p.name for p in out.iterdir()) == ["alpha-1.0-py3-none-any.whl"]
        f.fetch([Requirement("beta")], build=True)  # a build runs in an environment of its own
    assert "beta-2.0-py3-none-any.whl" in {p.name for p in out.iterdir()}


def test_a_file_that_does_not_match_its_hash_is_refused(index_files: Path, tmp_path: Path) -> None:
    with SimpleIndex(index_files).running() as index:
        f = fetcher(index, tmp_path / "downloads")
        pages = f._candidates("beta")  # listed (with the hashes the index gave) ...
        (index_files / "beta-2.0-py3-none-any.whl").write_bytes(b"tampered")  # ... then changed
        assert pages
        with pytest.raises(PackageError, match="does not match the hash"):
            f.fetch([Requirement("beta")])


def test_an_index_that_cannot_be_reached_says_which(tmp_path: Path) -> None:
    f = Fetcher(PackageSources("http://127.0.0.1:9/simple", (), ()), TARGET, {}, tmp_path)
    with pytest.raises(PackageError, match=r"cannot download http://127\.0\.0\.1:9/simple/alpha/"):
        f.fetch([Requirement("alpha")])


def test_credentials_in_the_index_url_are_sent_and_kept_for_its_files(
    index_files: Path, tmp_path: Path
) -> None:
    with SimpleIndex(index_files).running() as index:
        url = index.url.replace("http://", "http://reader:s%40cret@")
        seen: list[str | None] = []
        handler = index.server.httpd.RequestHandlerClass
        original = handler.do_GET

        def spy(self):  # type: ignore[no-untyped-def]
            seen.append(self.headers.get("Authorization"))
            return original(self)

        handler.do_GET = spy  # type: ignore[method-assign]
        Fetcher(PackageSources(url, (), ()), TARGET, {}, tmp_path / "d").fetch([Requirement("beta")])
    assert seen and all(a == "Basic cmVhZGVyOnNAY3JldA==" for a in seen), seen  # reader:s@cret
    assert (tmp_path / "d" / "beta-2.0-py3-none-any.whl").exists()

"""Import names: asking for what you import (``sklearn``, ``docx``) installs what provides it.

Real installs with uv from a wheelhouse the test builds: each import name there behaves as
on PyPI (``docx`` is an old sdist-only project, ``serial`` another project than
``pyserial``, ``cv2`` is not published at all).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import (
    Layer,
    PackageError,
    PackageInstaller,
    PackageSources,
    PythonTarget,
)
from kernmind.execution.packages.import_names import PUBLISHED_AS, published_as, substitute
from kernmind.execution.sandbox.bwrap import Sandbox
from tests.execution.packages.package_sources import make_sdist, make_wheel
from tests.execution.packages.test_packages import import_from, make_installer

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages")]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheelhouse")
    d.chmod(0o755)
    make_sdist(d, "docx", "0.2.4")  # as on PyPI: an old project with only an sdist
    make_wheel(d, "python-docx", "1.1.2", modules={"docx/__init__.py": "FROM = 'python-docx'\n"})
    make_wheel(d, "serial", "0.0.97", modules={"serial/__init__.py": "FROM = 'serial'\n"})
    make_sdist(d, "sklearn", "0.0.post12")  # PyPI's deprecated placeholder: no wheel
    make_wheel(d, "scikit-learn", "0.0.1", modules={"sklearn/__init__.py": "FROM = 'wheelhouse'\n"})
    return d


def installer_for(wheelhouse: Path, cache: Path, **policy: object) -> PackageInstaller:
    runtime = PythonRuntime.probe(None)
    target = PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath)
    return make_installer(
        Sandbox.detect("auto"), target, cache, PackageSources(None, (), (str(wheelhouse),)), **policy
    )


@pytest.fixture
def installer(wheelhouse: Path, tmp_path: Path) -> PackageInstaller:
    return installer_for(wheelhouse, tmp_path / "cache")


def test_the_table_names_the_usual_suspects_and_only_real_renames() -> None:
    expected = {
        "sklearn": "scikit-learn",
        "PIL": "pillow",
        "bs4": "beautifulsoup4",
        "cv2": "opencv-python-headless",
        "yaml": "PyYAML",
        "skimage": "scikit-image",
        "dateutil": "python-dateutil",
        "Crypto": "pycryptodome",
    }
    assert {name: published_as(name) for name in expected} == expected
    assert len(PUBLISHED_AS) >= 30
    assert all(canonicalize_name(dist) != module for module, dist in PUBLISHED_AS.items())
    assert published_as("pandas") is None
    reqs, replaced = substitute(
        [Requirement("sklearn[alldeps]>=1.3; python_version>'3'"), Requirement("numpy")]
    )
    assert [str(r) for r in reqs] == ['scikit-learn[alldeps]>=1.3; python_version > "3"', "numpy"]
    assert replaced == {"sklearn": "scikit-learn"}


async def test_an_import_name_that_fails_installs_the_published_project_with_a_note(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = Layer(tmp_path / "layer").create()
    result = await installer.install(["docx"], "python", layer)
    assert [(p.name, p.version) for p in result.installed] == [("python-docx", "1.1.2")]
    assert any("docx is the name you import, published as 'python-docx'" in n for n in result.notes)
    assert import_from(layer, "import docx; print(docx.FROM)").strip() == "python-docx"


async def test_readme_sklearn_gets_scikit_learn(installer: PackageInstaller, tmp_path: Path) -> None:
    """README's example: ``sklearn`` (on PyPI a placeholder that refuses to build) gives scikit-learn."""
    try:
        have = version("scikit-learn")  # the interpreter's own (the datascience extra) stays as it is
    except PackageNotFoundError:
        have = None
    result = await installer.install(["sklearn"], "python", Layer(tmp_path / "layer").create())
    listed = result.already_installed if have else result.installed
    assert [(p.name.lower(), p.version) for p in listed] == [("scikit-learn", have or "0.0.1")]
    assert any("published as 'scikit-learn'" in n for n in result.notes), result.notes
    said = "already installed: nothing was installed" if have else "installed under the published name"
    assert any(said in n for n in result.notes), result.notes


async def test_an_allow_list_of_published_names_lets_the_import_name_through(
    wheelhouse: Path, tmp_path: Path
) -> None:
    installer = installer_for(
        wheelhouse, tmp_path / "cache", mode="allowlist", allowlist=frozenset({"python-docx"})
    )
    result = await installer.install(["docx"], "python", Layer(tmp_path / "layer").create())
    assert [p.name for p in result.installed] == ["python-docx"]
    with pytest.raises(PackageError) as caught:
        await installer.install(["serial"], "python", Layer(tmp_path / "other").create())
    assert caught.value.kind == "policy" and "serial" in caught.value.message


async def test_an_unpublished_import_name_is_refused_naming_the_project(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = Layer(tmp_path / "layer").create()
    with pytest.raises(PackageError) as caught:
        await installer.install(["cv2"], "python", layer)
    assert caught.value.kind == "not_found"
    assert "'opencv-python-headless'" in caught.value.message and "cv2" in caught.value.message
    assert layer.python_distributions() == {}


async def test_another_project_under_the_import_name_installs_as_asked_with_a_warning(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    result = await installer.install(["serial"], "python", Layer(tmp_path / "layer").create())
    assert [p.name for p in result.installed] == ["serial"]
    assert any("comes from 'pyserial' (a different project)" in n for n in result.notes), result.notes


async def test_an_unrelated_failure_is_not_retried_under_another_name(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    with pytest.raises(PackageError) as caught:
        await installer.install(["serial", "no-such-thing-xyz"], "python", Layer(tmp_path / "layer").create())
    assert "no-such-thing-xyz" in caught.value.message and "failed too" not in caught.value.message

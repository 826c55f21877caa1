"""Installing packages into a session's layer: the server installs, with uv, under a policy.

Packages come from a wheelhouse (``--find-links``) and a PEP 503 index that the tests
build and serve themselves on 127.0.0.1; npm packages from a registry served the same
way. Nothing here needs the internet.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import (
    Layer,
    PackageError,
    PackageInstaller,
    PackagePolicy,
    PackageSources,
    PythonTarget,
)
from kernmind.execution.packages.npm import cached_npm_packages
from kernmind.execution.packages.policy import load_allowlist
from kernmind.execution.sandbox.bwrap import Sandbox
from tests.execution.packages.package_sources import NpmRegistry, SimpleIndex, make_sdist, make_wheel

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages")]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheelhouse")
    d.chmod(0o755)  # an operator's wheelhouse is readable: a sandboxed build reads it as another uid
    make_wheel(d, "alpha", "1.0", requires=("beta>=1",))
    make_wheel(d, "beta", "1.0")
    make_wheel(d, "beta", "2.0")
    make_sdist(d, "gamma", "1.0")
    make_wheel(d, "delta", "1.0", tag="cp39-cp39-win_amd64")
    make_wheel(d, "old-anyio-user", "1.0", requires=("anyio<1",))
    make_wheel(d, "anyio-user", "1.0", requires=("anyio>=4",))
    make_wheel(d, "withextra", "1.0", extras=("fancy",), requires=('beta>=1; extra == "fancy"',))
    return d


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox.detect("auto")


@pytest.fixture(scope="module")
def target() -> PythonTarget:
    runtime = PythonRuntime.probe(None)
    return PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


def make_installer(
    sandbox: Sandbox,
    target: PythonTarget,
    cache_dir: Path,
    sources: PackageSources,
    *,
    environ: dict[str, str] | None = None,
    ca_file: Path | None = None,
    **policy: object,
) -> PackageInstaller:
    return PackageInstaller(
        PackagePolicy(sources=sources, **policy),  # type: ignore[arg-type]
        target,
        cache_dir,
        sandbox,
        PackageInstaller.find_deno(),
        PackageInstaller.find_uv(),
        environ=environ or {},
        ca_file=ca_file,
    )


@pytest.fixture
def installer(sandbox: Sandbox, target: PythonTarget, cache_dir: Path, wheelhouse: Path) -> PackageInstaller:
    return make_installer(sandbox, target, cache_dir, PackageSources(None, (), (str(wheelhouse),)))


def new_layer(tmp_path: Path, name: str = "session") -> Layer:
    return Layer(tmp_path / name).create()


def import_from(layer: Layer, statement: str) -> str:
    """Run ``statement`` in the target interpreter with the layer after its own packages."""
    code = f"import sys; sys.path.append({str(layer.python)!r}); {statement}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def names(entries: list) -> dict[str, str]:
    return {e.name: e.version for e in entries}


# --- installing ---------------------------------------------------------------------------
async def test_install_lists_package_and_dependencies_and_they_import(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = new_layer(tmp_path)
    result = await installer.install(["alpha"], "python", layer)
    assert names(result.installed) == {"alpha": "1.0", "beta": "2.0"}
    assert result.already_installed == []
    assert result.duration_ms > 0
    assert import_from(layer, "import alpha, beta; print(alpha.VERSION, beta.VERSION)").split() == [
        "1.0",
        "2.0",
    ]


async def test_packages_the_interpreter_has_are_not_installed_again(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = new_layer(tmp_path)
    result = await installer.install(["anyio-user", "anyio"], "python", layer)
    assert names(result.installed) == {"anyio-user": "1.0"}
    assert names(result.already_installed) == {"anyio": version("anyio")}
    assert not (layer.python / "anyio").exists()


async def test_repeat_install_in_same_layer_has_nothing_to_do(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = new_layer(tmp_path)
    await installer.install(["alpha"], "python", layer)
    again = await installer.install(["alpha", "beta>=2"], "python", layer)
    assert again.installed == []
    assert names(again.already_installed) == {"alpha": "1.0", "beta": "2.0"}
    assert "already installed" in again.notes[0]


async def test_an_extra_of_an_installed_package_adds_only_the_extras_dependencies(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    layer = new_layer(tmp_path)
    assert names((await installer.install(["withextra"], "python", layer)).installed) == {"withextra": "1.0"}
    again = await installer.install(["withextra[fancy]"], "python", layer)
    assert names(again.installed) == {"beta": "2.0"}


async def test_second_session_does_not_see_first_sessions_packages(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    first, second = new_layer(tmp_path, "one"), new_layer(tmp_path, "two")
    await installer.install(["alpha"], "python", first)
    assert second.python_distributions() == {}
    failed = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.append({str(second.python)!r}); import alpha"],
        capture_output=True,
        text=True,
    )
    assert "No module named 'alpha'" in failed.stderr


async def test_install_from_a_simple_index_and_repeat_comes_from_the_shared_cache(
    sandbox: Sandbox, target: PythonTarget, wheelhouse: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with SimpleIndex(wheelhouse).running() as index:
        installer = make_installer(sandbox, target, cache, PackageSources(index.url))
        first = await installer.install(["alpha"], "python", new_layer(tmp_path, "one"))
        assert names(first.installed) == {"alpha": "1.0", "beta": "2.0"}
        downloads = [r for r in index.requests if r.startswith("/files/")]
        assert downloads, "the first install downloads the wheels"
        index.requests.clear()
        second = await installer.install(["alpha"], "python", new_layer(tmp_path, "two"))
        assert names(second.installed) == {"alpha": "1.0", "beta": "2.0"}
        assert [r for r in index.requests if r.startswith("/files/")] == [], "wheels came from the cache"
    one, two = (tmp_path / name / "python" / "alpha" for name in ("one", "two"))
    assert (one / "__init__.py").stat().st_ino == (two / "__init__.py").stat().st_ino, "linked, not copied"
    assert list((two / "__pycache__").glob("__init__.cpython-*.pyc")), "byte-compiled once, for every session"


# --- what is refused, and how ------------------------------------------------------------
async def test_sdist_is_refused_by_default(installer: PackageInstaller, tmp_path: Path) -> None:
    layer = new_layer(tmp_path)
    with pytest.raises(PackageError) as caught:
        await installer.install(["gamma"], "python", layer)
    assert caught.value.kind == "sdist_refused"
    assert "gamma" in caught.value.message and "--allow-sdist" in caught.value.message
    assert layer.python_distributions() == {}


async def test_allowed_sdist_is_built_inside_the_sandbox(
    sandbox: Sandbox, target: PythonTarget, cache_dir: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    installer = make_installer(
        sandbox, target, cache_dir, PackageSources(None, (), (str(wheelhouse),)), allow_sdist=True
    )
    layer = new_layer(tmp_path)
    result = await installer.install(["gamma", "alpha"], "python", layer)
    assert names(result.installed) == {"gamma": "1.0", "alpha": "1.0", "beta": "2.0"}
    assert any("built from source" in n for n in result.notes)
    built = import_from(layer, "import gamma; print(gamma.BUILT)").strip()
    uid, netns = dict(part.split("=", 1) for part in built.split()).values()
    if sandbox.drops_privileges:
        assert int(uid) != os.getuid(), "the build ran as the sandbox's own uid"
    if sandbox.isolated:
        assert netns != os.readlink("/proc/self/ns/net"), "the build ran in its own network namespace"
    for path in layer.python.rglob("*"):
        assert not path.is_symlink()
        assert path.lstat().st_uid == os.getuid()


async def test_a_source_build_has_no_network_not_even_the_hosts_loopback(
    sandbox: Sandbox, target: PythonTarget, cache_dir: Path, tmp_path: Path
) -> None:
    """With a remote index, the server downloads what the build needs and the build runs with no
    network: a hostile build backend cannot reach a port on 127.0.0.1 (as kernmind's own, or a
    database's); benign source builds still work, their dependencies declared (fetched at once) or
    known only to their backend (fetched when the offline resolution names them)."""
    if not sandbox.isolated:
        pytest.skip(f"no sandbox here: {sandbox.reason}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    files = tmp_path / "index"
    files.mkdir(mode=0o755)
    make_sdist(files, "hostile", "1.0", connect=listener.getsockname()[1])
    make_sdist(files, "declared", "1.0", requires=("alpha>=1",))
    make_sdist(files, "dynamic-deps", "2.0", requires=("epsilon>=1",), dynamic=True)
    make_wheel(files, "alpha", "1.0", requires=("beta>=1",))
    make_wheel(files, "beta", "2.0")
    make_wheel(files, "epsilon", "1.0")
    layer = new_layer(tmp_path)
    try:
        with SimpleIndex(files).running() as index:
            installer = make_installer(
                sandbox, target, cache_dir, PackageSources(index.url, (), ()), allow_sdist=True
            )
            result = await installer.install(["hostile", "declared", "dynamic-deps"], "python", layer)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
    finally:
        listener.close()
    reached = import_from(layer, "import hostile; print(hostile.REACHED)").strip()
    # The sandbox's own loopback answers nobody; the host's is not there.
    assert reached.startswith("refused: ") and ("refused" in reached[9:] or "unreachable" in reached), reached
    assert names(result.installed) == {
        "hostile": "1.0",
        "declared": "1.0",
        "dynamic-deps": "2.0",
        "alpha": "1.0",
        "beta": "2.0",
        "epsilon": "1.0",
    }
    assert (
        import_from(layer, "import declared, dynamic_deps, alpha; print(dynamic_deps.VERSION)").strip()
        == "2.0"
    )


async def test_policy_none_refuses_everything(
    sandbox: Sandbox, target: PythonTarget, cache_dir: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    installer = make_installer(
        sandbox, target, cache_dir, PackageSources(None, (), (str(wheelhouse),)), mode="none"
    )
    for language, spec in (("python", "alpha"), ("javascript", "npm:leftpad")):
        with pytest.raises(PackageError) as caught:
            await installer.install([spec], language, new_layer(tmp_path))
        assert caught.value.kind == "policy" and "--packages none" in caught.value.message


async def test_allowlist_admits_listed_packages_with_their_dependencies(
    sandbox: Sandbox, target: PythonTarget, cache_dir: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    listing = tmp_path / "allowed.txt"
    listing.write_text("# what models may install\nAlpha  # its dependency beta comes along\nnpm:leftpad\n")
    installer = make_installer(
        sandbox,
        target,
        cache_dir,
        PackageSources(None, (), (str(wheelhouse),)),
        mode="allowlist",
        allowlist=load_allowlist(listing),
    )
    layer = new_layer(tmp_path)
    assert names((await installer.install(["alpha"], "python", layer)).installed) == {
        "alpha": "1.0",
        "beta": "2.0",
    }
    with pytest.raises(PackageError) as caught:
        await installer.install(["alpha", "delta"], "python", layer)
    assert caught.value.kind == "policy"
    assert "delta" in caught.value.message and "alpha, npm:leftpad" in caught.value.message


def test_allowlist_file_errors_name_the_line(tmp_path: Path) -> None:
    listing = tmp_path / "allowed.txt"
    listing.write_text("pandas\nrequests>=2\n")
    with pytest.raises(ValueError, match=r"allowed.txt:2: 'requests>=2' is not a package name"):
        load_allowlist(listing)
    with pytest.raises(ValueError, match="cannot read the package allow-list"):
        load_allowlist(tmp_path / "missing.txt")


async def test_unknown_package_is_not_found_with_spelling_help(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    with pytest.raises(PackageError) as caught:
        await installer.install(["no-such-package-xyz"], "python", new_layer(tmp_path))
    assert caught.value.kind == "not_found" and "'no-such-package-xyz'" in caught.value.message
    with pytest.raises(PackageError) as caught:  # (tried under its published name: test_import_names.py)
        await installer.install(["cv2"], "python", new_layer(tmp_path, "cv2"))
    assert "published as 'opencv-python-headless'" in caught.value.message
    with pytest.raises(PackageError) as caught:
        await installer.install(["beta==9"], "python", new_layer(tmp_path))
    assert caught.value.kind == "not_found" and "beta" in caught.value.message


async def test_no_wheel_for_this_platform(installer: PackageInstaller, tmp_path: Path) -> None:
    with pytest.raises(PackageError) as caught:
        await installer.install(["delta"], "python", new_layer(tmp_path))
    assert caught.value.kind == "no_wheel"
    assert "delta has no wheel for this platform" in caught.value.message and "cp39" in caught.value.message


async def test_clash_with_an_installed_package_names_it(installer: PackageInstaller, tmp_path: Path) -> None:
    layer = new_layer(tmp_path)
    with pytest.raises(PackageError) as caught:
        await installer.install(["old-anyio-user"], "python", layer)
    assert caught.value.kind == "conflict"
    assert f"anyio {version('anyio')} is already installed" in caught.value.message
    assert layer.python_distributions() == {}


async def test_unreachable_index_is_a_network_error(
    sandbox: Sandbox, target: PythonTarget, cache_dir: Path, tmp_path: Path
) -> None:
    installer = make_installer(sandbox, target, cache_dir, PackageSources("http://127.0.0.1:9/simple"))
    with pytest.raises(PackageError) as caught:
        await installer.install(["alpha"], "python", new_layer(tmp_path))
    assert caught.value.kind == "network" and "http://127.0.0.1:9/simple" in caught.value.message


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("-e .", "looks like a command-line option"),
        ("--index-url=http://evil/", "looks like a command-line option"),
        ("alpha @ https://example.com/alpha.whl", "names a URL"),
        ("npm:leftpad", "language='javascript'"),
        ("not a requirement!", "is not a valid requirement"),
    ],
)
async def test_malformed_requests_are_refused_before_any_install(
    installer: PackageInstaller, tmp_path: Path, spec: str, hint: str
) -> None:
    with pytest.raises(PackageError) as caught:
        await installer.install([spec], "python", new_layer(tmp_path))
    assert caught.value.kind == "invalid" and hint in caught.value.message


async def test_other_languages_are_refused_naming_what_is_supported(
    installer: PackageInstaller, tmp_path: Path
) -> None:
    for language in ("r", "java", "bash"):
        with pytest.raises(PackageError) as caught:
            await installer.install(["anything"], language, new_layer(tmp_path))
        assert caught.value.kind == "unsupported"
        assert "language='python'" in caught.value.message and "npm:" in caught.value.message
    with pytest.raises(PackageError, match="no packages given"):
        await installer.install([], "python", new_layer(tmp_path))


# --- npm for Deno ----------------------------------------------------------------------------
LEFTPAD = "module.exports = (s, n, c = '.') => String(s).padStart(n, c);"


async def test_npm_package_prefetched_then_imported_offline_in_the_sandbox(
    installer: PackageInstaller, sandbox: Sandbox, tmp_path: Path
) -> None:
    if installer.deno is None:
        pytest.skip("Deno is not installed")
    with NpmRegistry(
        {"leftpad": {"1.0.0": LEFTPAD}, "@km/greet": {"2.0.0": "exports.hi = () => 'hi';"}}
    ).running() as reg:
        installer.host_env["NPM_CONFIG_REGISTRY"] = f"{reg.url}/"
        layer = new_layer(tmp_path)
        result = await installer.install(["npm:leftpad@1", "@km/greet@^2"], "javascript", layer)
        assert names(result.installed) == {"leftpad": "1.0.0", "@km/greet": "2.0.0"}
        with pytest.raises(PackageError) as caught:
            await installer.install(["npm:no-such-thing"], "javascript", layer)
        assert caught.value.kind == "not_found" and "no-such-thing" in caught.value.message
        # Another session: served from the shared cache, and it gets only what it asked for.
        reg.requests.clear()
        other = new_layer(tmp_path, "other")
        again = await installer.install(["npm:leftpad@1"], "javascript", other)
        assert names(again.installed) == {"leftpad": "1.0.0"}
        assert [r for r in reg.requests if "/-/" in r] == [], "no tarball downloaded again"
        assert {d.name for d in cached_npm_packages(other.deno)} == {"leftpad"}
    # The registry is gone and the sandbox has no network: the import must come from the layer.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "main.mjs").write_text(
        'import pad from "npm:leftpad@1";\nimport { hi } from "npm:@km/greet@2";\nconsole.log(pad(7, 3), hi());\n'
    )
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(workspace, uid, uid)
    inner = sandbox.workspace_path(workspace)
    cmd = sandbox.wrap(
        [
            installer.deno,
            "run",
            "--cached-only",
            "--no-lock",
            "--no-config",
            f"--allow-read={inner}",
            "main.mjs",
        ],
        workspace=workspace,
        env={"DENO_DIR": str(layer.deno), "NO_COLOR": "1", "NPM_CONFIG_REGISTRY": f"{reg.url}/"},
        ro_paths=[os.path.realpath(installer.deno), str(layer.deno)],
        uid=uid,
    )
    proc = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "..7 hi"


def test_npm_specifiers_are_validated() -> None:
    from kernmind.execution.packages.policy import parse_npm

    assert parse_npm(["npm:lodash@4", "lodash", "@types/node@^20"]) == [
        ("lodash", "npm:lodash@4"),
        ("lodash", "npm:lodash"),
        ("@types/node", "npm:@types/node@^20"),
    ]
    for bad in ("jsr:@std/path", "https://x/y.js", "Lodash; rm -rf /", "npm:lodash@4 && x"):
        with pytest.raises(PackageError):
            parse_npm([bad])

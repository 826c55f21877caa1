"""Python packages: resolve with uv against what the interpreter already has, install the rest.

Design
- A layer only adds: every installed distribution becomes a ``name==version`` constraint and a
  metadata-only stub wheel, so uv (installing into an empty ``--target``) resolves around it.
- Each new pin is installed once, byte-compiled, into a shared ``CompiledStore``; layers get
  hard links to it. uv runs as ``HostUv`` (wheels only: no package code runs) or sandboxed
  (``sdist.py``), in the session's control group during its install.

Error policy: refusals and failures are ``PackageError`` (see ``diagnose.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kernmind.execution.packages.diagnose import explain
from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError, PackageSources
from kernmind.execution.sandbox.limits import SessionLimits, current_limits

_PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$")

# Runs in the target interpreter: its site directories and installed distributions.
_PROBE = """\
import json, site, sys, sysconfig
from importlib import metadata
dirs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
               *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))})
dists = sorted({(d.metadata["Name"], d.version, tuple(d.requires or ()), tuple(d.metadata.get_all("Provides-Extra") or ()))
                for d in metadata.distributions() if d.metadata["Name"]})
print(json.dumps({"dirs": dirs, "dists": dists}))
"""


@dataclass(frozen=True)
class PythonTarget:
    """The interpreter packages are installed for: the one that runs kernels."""

    executable: str
    paths: tuple[str, ...] = ()  # directories a sandbox must expose for it to run
    pythonpath: tuple[str, ...] = ()  # extra entries its kernels get on PYTHONPATH


class UvRunner(Protocol):
    """Runs ``uv <args>``; ``path`` says how that process sees a host path."""

    def path(self, host: Path) -> str: ...

    async def __call__(self, args: Sequence[str], *, timeout: float) -> tuple[int, str, str]: ...


@dataclass
class HostUv:
    """uv run by the server itself, with the host's proxy and certificate variables."""

    binary: str
    env: dict[str, str]

    def path(self, host: Path) -> str:
        return str(host)

    async def __call__(self, args: Sequence[str], *, timeout: float) -> tuple[int, str, str]:
        proc = await run_in_session_group([self.binary, *args], self.env, timeout)
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


async def run_in_session_group(
    argv: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[bytes]:
    """Run a host command of an install (uv, Deno), in the session's control group within its install
    (``current_limits``); raises ``TimeoutError`` after ``timeout`` seconds."""
    session = current_limits.get()
    group = session.ensure_group() if session is not None else None
    command = group.join_argv(argv) if group is not None else list(argv)
    with anyio.fail_after(timeout):
        proc = await anyio.run_process(command, env=env, check=False)
    check_session_memory(session)
    return proc


def check_session_memory(session: SessionLimits | None) -> None:
    """Raise the memory sentence when the kernel's out-of-memory killer stopped a process of the
    session (the install's, most likely) while it ran."""
    if session is not None and session.memory_exceeded():
        raise PackageError("memory", session_memory_note(session))


def session_memory_note(session: SessionLimits) -> str:
    return (
        f"the install used more than the session's {session.limits.memory_mb} MiB memory limit "
        "(--memory-mb), counted together with the session's interpreter and the files in its /tmp "
        "and /dev/shm, and was stopped; nothing was added. Free memory in the session first (del "
        "large variables, delete files in /tmp and /dev/shm), install fewer packages at once, or ask "
        "the operator for a larger --memory-mb."
    )


@dataclass
class BaseEnvironment:
    """What the target interpreter has installed; probed again when its site directories change."""

    target: PythonTarget
    _dirs: list[str] = field(default_factory=list)
    _stamp: tuple[float, ...] = ()
    _dists: dict[str, Distribution] = field(default_factory=dict)

    def distributions(self) -> dict[str, Distribution]:
        if not self._dists or self._fingerprint() != self._stamp:
            env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
            if self.target.pythonpath:
                env["PYTHONPATH"] = os.pathsep.join(self.target.pythonpath)
            out = subprocess.run(
                [self.target.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env
            )
            if out.returncode != 0:
                raise PackageError(
                    "installer", f"cannot inspect {self.target.executable}: {out.stderr.strip()}"
                )
            info = json.loads(out.stdout)
            self._dirs = info["dirs"]
            self._dists = {
                canonicalize_name(n): Distribution(n, v, tuple(req), tuple(ex))
                for n, v, req, ex in info["dists"]
            }
            self._stamp = self._fingerprint()
        return self._dists

    def _fingerprint(self) -> tuple[float, ...]:
        stamps = []
        for d in self._dirs:
            try:
                stamps.append(os.stat(d).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)


def write_stub_wheels(directory: Path, dists: Sequence[Distribution]) -> None:
    """One metadata-only wheel per distribution (a resolver's stand-in for 'already installed'),
    with its real dependencies and extras, so ``pandas[excel]`` resolves the extra's packages."""
    directory.mkdir(parents=True, exist_ok=True)
    for d in dists:
        dist = re.sub(r"[^\w.]+", "_", d.name)
        version = d.version.replace("-", "_")
        info = f"{dist}-{version}.dist-info"
        with zipfile.ZipFile(directory / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
            meta = f"Metadata-Version: 2.1\nName: {d.name}\nVersion: {d.version}\n"
            meta += "".join(f"Provides-Extra: {e}\n" for e in d.extras)
            meta += "".join(f"Requires-Dist: {r}\n" for r in d.requires)
            zf.writestr(f"{info}/METADATA", meta)
            zf.writestr(
                f"{info}/WHEEL",
                "Wheel-Version: 1.0\nGenerator: kernmind\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            zf.writestr(f"{info}/RECORD", "")


def cached_stubs(cache_dir: Path, dists: Mapping[str, Distribution]) -> Path:
    """The stub directory for this exact set of distributions, built once and reused."""
    lines = sorted(f"{d.key}=={d.version} {d.requires} {d.extras}" for d in dists.values())
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]
    final = cache_dir / "kernmind-stubs" / digest
    if not final.is_dir():
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".stubs-", dir=final.parent))
        write_stub_wheels(staging, list(dists.values()))
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, final)
        except OSError:  # built concurrently by another install: keep theirs
            shutil.rmtree(staging, ignore_errors=True)
    return final


@dataclass(frozen=True)
class Installed:
    """What a resolution keeps fixed: the interpreter's distributions (``base``, with their stub
    wheels in ``base_stubs``) and the layer's."""

    base: Mapping[str, Distribution]
    base_stubs: Path
    layer: Mapping[str, Distribution]

    @property
    def available(self) -> dict[str, Distribution]:
        return {**self.base, **self.layer}


@dataclass
class Resolution:
    installed: list[Distribution]
    already: list[Distribution]


@dataclass
class CompiledStore:
    """Installed, byte-compiled copies of single distributions, shared by every session.

    uv's cache holds no bytecode and layers are read-only, so each import would compile again (several times
    slower, benchmarks/README.md); hard links keep the sources' mtimes, so the ``.pyc`` files stay valid.
    """

    root: Path

    @classmethod
    def for_target(cls, cache_dir: Path, target: PythonTarget) -> CompiledStore:
        key = hashlib.sha256(os.path.realpath(target.executable).encode()).hexdigest()[:16]
        return cls(cache_dir / "kernmind-store" / key)

    def entry(self, dist: Distribution) -> Path:
        return self.root / f"{dist.key}-{dist.version}"

    async def ensure(
        self, uv: UvRunner, dist: Distribution, common: Sequence[str], timeout: float
    ) -> str | None:
        """Install ``dist`` into the store unless it is there; uv's error output on failure."""
        if await anyio.Path(self.entry(dist)).is_dir():
            return None
        staging = await anyio.to_thread.run_sync(_staging_dir, self.root)
        args = ["pip", "install", *common, "--target", uv.path(staging), "--no-deps", "--compile-bytecode"]
        code, _, err = await _run(uv, [*args, f"{dist.name}=={dist.version}"], timeout)
        await anyio.to_thread.run_sync(_publish, staging, self.entry(dist), code == 0)
        return None if code == 0 else err

    def link_into(self, dists: Sequence[Distribution], directory: Path) -> None:
        for dist in dists:
            shutil.copytree(self.entry(dist), directory, copy_function=_link, dirs_exist_ok=True)


def _staging_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=root))


def _publish(staging: Path, final: Path, ok: bool) -> None:
    (staging / ".lock").unlink(missing_ok=True)  # uv's lock for a --target directory
    if ok:
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, final)
            return
        except OSError:  # installed concurrently by another session: keep theirs
            pass
    shutil.rmtree(staging, ignore_errors=True)


def _link(src: str, dst: str) -> None:
    if not os.path.exists(dst):  # a file two distributions share: the first one stays
        os.link(src, dst)


def _prepare_resolution(
    scratch: Path,
    requirements: Sequence[Requirement],
    available: Mapping[str, Distribution],
    layer: Mapping[str, Distribution],
) -> None:
    (scratch / "requirements.in").write_text("".join(f"{r}\n" for r in requirements))
    (scratch / "constraints.txt").write_text("".join(f"{d.key}=={d.version}\n" for d in available.values()))
    write_stub_wheels(scratch / "layer-stubs", list(layer.values()))


async def resolve_and_install(
    uv: UvRunner,
    requirements: Sequence[Requirement],
    *,
    target: PythonTarget,
    installed: Installed,
    sources: PackageSources,
    install_dir: Path,
    cache_dir: Path,
    scratch: Path,
    wheels_only: bool,
    timeout: float,
    store: CompiledStore | None = None,
) -> Resolution:
    """Resolve ``requirements`` with everything ``installed`` fixed; install what is new into
    ``install_dir`` (through ``store`` when given, else directly)."""
    available = installed.available
    satisfied = [
        available[key]
        for r in requirements
        if (key := canonicalize_name(r.name)) in available
        and not r.extras
        and r.specifier.contains(available[key].version, prereleases=True)
    ]
    if len(satisfied) == len(requirements):
        return Resolution([], satisfied)  # nothing to resolve: no installer run at all
    await anyio.to_thread.run_sync(_prepare_resolution, scratch, requirements, available, installed.layer)
    common = [
        "--no-config",
        "--python",
        target.executable,
        "--cache-dir",
        uv.path(cache_dir),
        *sources.uv_args,
    ]
    if wheels_only:
        common += ["--only-binary", ":all:"]
    compile_args = ["pip", "compile", *common, "--no-header", "--no-annotate"]
    compile_args += [
        "--find-links",
        uv.path(installed.base_stubs),
        "--find-links",
        uv.path(scratch / "layer-stubs"),
    ]
    compile_args += [
        "--constraints",
        uv.path(scratch / "constraints.txt"),
        uv.path(scratch / "requirements.in"),
    ]
    code, out, err = await _run(uv, compile_args, timeout)
    if code != 0:
        raise explain(err, sources=sources, available=available)
    pins = [Distribution(m.group(1), m.group(2)) for line in out.splitlines() if (m := _PIN_LINE.match(line))]
    new = [p for p in pins if p.key not in available]
    if new and store is not None:
        for dist in new:
            if (failure := await store.ensure(uv, dist, common, timeout)) is not None:
                raise explain(failure, sources=sources, available=available)
        await anyio.to_thread.run_sync(store.link_into, new, install_dir)
    elif new:
        install_args = [
            "pip",
            "install",
            *common,
            "--target",
            uv.path(install_dir),
            "--no-deps",
            "--compile-bytecode",
        ]
        code, _, err = await _run(uv, [*install_args, *(f"{p.name}=={p.version}" for p in new)], timeout)
        if code != 0:
            raise explain(err, sources=sources, available=available)
    return Resolution(new, satisfied)


async def _run(uv: UvRunner, args: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        return await uv(args, timeout=timeout)
    except TimeoutError:
        raise PackageError(
            "timeout",
            f"the install did not finish within {timeout:g} s (slow network or a large package); "
            "it was stopped and nothing was added. Try again, or install fewer packages at once.",
        ) from None

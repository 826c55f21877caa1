"""npm packages for JavaScript/TypeScript: prefetched on the host into the session's Deno cache.

Design: ``deno cache`` on a module importing the ``npm:`` specifiers, with a ``DENO_DIR``
shared by all sessions (no package code runs: Deno runs no lifecycle scripts); ``deno info
--json`` lists what resolved, and exactly those (hard links) and their ``registry.json`` go
into the layer. Code then runs ``--cached-only`` against the layer, read-only. The registry is
the host's ``NPM_CONFIG_REGISTRY`` (Deno keys its cache by it). Within a session's install Deno
runs in the session's control group.

Error policy: ``PackageError`` "not_found", "network" (with ``trust.py``'s explanation),
"timeout", else "installer" with Deno's message.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from subprocess import CompletedProcess

import anyio

from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError
from kernmind.execution.packages.python import run_in_session_group
from kernmind.execution.packages.trust import certificate_refusal

_DOES_NOT_EXIST = re.compile(r"npm package '([^']+)' does not exist")
_NO_MATCH = re.compile(r"Could not find npm package '([^']+)' matching '([^']+)'")
_NETWORK = re.compile(r"error sending request|dns error|tcp connect error|Connection refused|timed out", re.I)


def find_deno() -> str | None:
    """The Deno binary: the ``deno`` PyPI package's, else one on PATH (None when neither)."""
    try:
        import deno

        return deno.find_deno_bin()
    except (ImportError, FileNotFoundError, OSError):
        return shutil.which("deno")


def cached_npm_packages(deno_dir: Path) -> set[Distribution]:
    """Every ``(name, version)`` in a Deno cache's npm folder (any registry)."""
    found: set[Distribution] = set()
    root = deno_dir / "npm"
    if not root.is_dir():
        return found
    for registry in root.iterdir():
        for entry in registry.iterdir() if registry.is_dir() else ():
            packages = (
                [(f"{entry.name}/{p.name}", p) for p in entry.iterdir()]
                if entry.name.startswith("@")
                else [(entry.name, entry)]
            )
            for name, folder in packages:
                if folder.is_dir():
                    found.update(Distribution(name, v.name) for v in folder.iterdir() if v.is_dir())
    return found


async def prefetch(
    deno: str,
    specifiers: Sequence[str],
    *,
    deno_dir: Path,
    shared_dir: Path,
    host_env: Mapping[str, str],
    timeout: float,
) -> list[Distribution]:
    """Fetch ``npm:`` specifiers into ``shared_dir``, link them into ``deno_dir``; return what was added."""
    env = {**host_env, "DENO_DIR": str(shared_dir), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
    with tempfile.TemporaryDirectory(prefix="kernmind-npm-") as tmp:
        entry = Path(tmp) / "packages.mjs"
        await anyio.Path(entry).write_text("".join(f"import {json.dumps(s)};\n" for s in specifiers))
        proc = await _deno(deno, ["cache", "--no-config", "--no-lock", str(entry)], env, timeout)
        if proc.returncode != 0:
            raise _explain(
                proc.stderr.decode(errors="replace"),
                env.get("NPM_CONFIG_REGISTRY") or env.get("npm_config_registry"),
            )
        info = await _deno(deno, ["info", "--json", "--no-config", "--no-lock", str(entry)], env, timeout)
    try:
        folders = [Path(p["localPath"]) for p in json.loads(info.stdout)["npmPackages"].values()]
    except (ValueError, KeyError, TypeError) as exc:
        raise PackageError("installer", f"Deno did not report what it fetched: {exc}") from None
    before = await anyio.to_thread.run_sync(cached_npm_packages, deno_dir)
    await anyio.to_thread.run_sync(_link_packages, folders, shared_dir, deno_dir)
    after = await anyio.to_thread.run_sync(cached_npm_packages, deno_dir)
    return sorted(after - before, key=lambda d: (d.name, d.version))


async def _deno(
    deno: str, args: list[str], env: Mapping[str, str], timeout: float
) -> CompletedProcess[bytes]:
    try:
        return await run_in_session_group([deno, *args], env, timeout)
    except TimeoutError:
        raise PackageError(
            "timeout", f"fetching the npm packages did not finish within {timeout:g} s; try again."
        ) from None


def _link_packages(folders: Sequence[Path], shared_dir: Path, deno_dir: Path) -> None:
    """Give ``deno_dir`` the package folders (hard links) and their registry metadata (copies)."""
    for folder in folders:
        rel = folder.relative_to(shared_dir)  # npm/<registry>/<name>/<version>
        target = deno_dir / rel
        if not target.exists():
            shutil.copytree(folder, target, copy_function=os.link)
        meta = folder.parent / "registry.json"
        if meta.is_file():
            shutil.copyfile(meta, target.parent / "registry.json")


def _explain(stderr: str, registry: str | None) -> PackageError:
    where = f"the npm registry {registry}" if registry else "the npm registry"
    if m := _DOES_NOT_EXIST.search(stderr):
        return PackageError(
            "not_found", f"no npm package named {m.group(1)!r} in {where}; check the spelling."
        )
    if m := _NO_MATCH.search(stderr):
        return PackageError(
            "not_found",
            f"no version of npm package {m.group(1)!r} matches {m.group(2)!r}; "
            "ask for another version, or leave the version out to get the newest.",
        )
    message = " ".join(
        ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Download ")
    )
    message = message.removeprefix("error: ")[:1200]
    if (refusal := certificate_refusal(stderr, where)) is not None:
        return refusal
    if _NETWORK.search(stderr):
        return PackageError("network", f"could not reach {where}: {message}")
    return PackageError("installer", f"Deno could not fetch the packages: {message}")

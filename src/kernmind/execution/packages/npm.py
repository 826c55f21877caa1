"""npm packages for JavaScript/TypeScript: prefetched into the session's Deno cache on the host.

``deno cache npm:lodash@4`` (run by the server, with ``DENO_DIR`` = the layer's ``deno``
directory) downloads the package, its dependencies and the registry's metadata; it runs
no package code (Deno does not run npm lifecycle scripts). Code in the sandbox then runs
with the same ``DENO_DIR`` mounted read-only and ``--cached-only``, so
``import _ from "npm:lodash@4"`` resolves offline. The registry is the host's
``NPM_CONFIG_REGISTRY`` (default registry.npmjs.org); the sandbox must be given the same
value, since Deno keys its cache by registry.

What was installed is read from the cache before and after (top-level packages and their
dependencies alike).

Error policy: ``PackageError`` — "not_found" (no such package or no matching version),
"network", "timeout", else "installer" with Deno's message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError

_DOES_NOT_EXIST = re.compile(r"npm package '([^']+)' does not exist")
_NO_MATCH = re.compile(r"Could not find npm package '([^']+)' matching '([^']+)'")
_NETWORK = re.compile(r"error sending request|dns error|tcp connect error|Connection refused|timed out", re.I)


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
    host_env: Mapping[str, str],
    timeout: float,
) -> list[Distribution]:
    """Download ``npm:`` specifiers into ``deno_dir``; return the packages that were added."""
    before = await anyio.to_thread.run_sync(cached_npm_packages, deno_dir)
    env = {**host_env, "DENO_DIR": str(deno_dir), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
    try:
        with anyio.fail_after(timeout):
            proc = await anyio.run_process(
                [deno, "cache", "--no-config", "--no-lock", *specifiers], env=env, check=False
            )
    except TimeoutError:
        raise PackageError(
            "timeout", f"fetching the npm packages did not finish within {timeout:g} s; try again."
        ) from None
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise _explain(err, env.get("NPM_CONFIG_REGISTRY") or env.get("npm_config_registry"))
    after = await anyio.to_thread.run_sync(cached_npm_packages, deno_dir)
    return sorted(after - before, key=lambda d: (d.name, d.version))


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
    if _NETWORK.search(stderr):
        return PackageError("network", f"could not reach {where}: {message}")
    return PackageError("installer", f"Deno could not fetch the packages: {message}")

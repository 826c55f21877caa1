"""Turn an installer's failure output into a sentence a model can act on.

Design: uv's chain of "Because …" clauses is reduced to the one fact that matters (no such
package, only source code, no wheel for this Python, a clash with an installed package, no
network, an untrusted certificate) and what to do, with uv's explanation appended where it
adds detail; anything unrecognised keeps uv's text, trimmed.

Error policy: nothing here raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from packaging.utils import canonicalize_name

from kernmind.execution.packages.import_names import published_as
from kernmind.execution.packages.layer import Distribution
from kernmind.execution.packages.policy import PackageError, PackageSources
from kernmind.execution.packages.trust import certificate_refusal

_NETWORK = re.compile(
    r"dns error|failed to lookup address|connection refused|tcp connect error|error sending request|"
    r"could not connect|operation timed out|network is unreachable|proxy|request failed after \d+ retries",
    re.I,
)
_NOT_FOUND = re.compile(r"Because (\S+) was not found in the (?:package registry|provided package locations)")
_NO_VERSION = re.compile(r"there is no version of (\S+?)(?:\[[^\]]*\])?(==|>=|<=|~=|!=|>|<)(\S+?)[ ,]")
_SDIST_ONLY = re.compile(
    r"(?:Because |and )(?:all versions of )?(\S+?)(?:==\S+)? (?:has|have) no usable wheels"
)
_NO_TAGS = re.compile(
    r"(\S+?)(?:==\S+)? has no wheels with a matching (Python ABI tag|platform tag|Python implementation tag|Python version)"
)
_REQUIRES_PYTHON = re.compile(r"current Python version \(([^)]+)\) does not satisfy (Python\S*)")
_PIN = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s,]+?)[\s,.]")


def _section(text: str, label: str) -> str:
    """uv's ``cause:``/``hint:`` paragraph as one line."""
    match = re.search(rf"^\s*{label}:\s*(.*?)(?=^\s*(?:cause|hint|error):|\Z)", text, re.S | re.M)
    return " ".join(match.group(1).split()).replace("`", "") if match else ""


def _error_text(text: str) -> str:
    lines = [
        ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith(("Using ", "Resolved "))
    ]
    joined = " ".join(" ".join(lines).split()).replace("`", "")
    return joined[:1500] + ("…" if len(joined) > 1500 else "")


def explain(stderr: str, *, sources: PackageSources, available: Mapping[str, Distribution]) -> PackageError:
    """The ``PackageError`` for uv's failure output ``stderr``."""
    cause, hint = _section(stderr, "cause"), _section(stderr, "hint")
    detail = cause or _error_text(stderr)
    if (refusal := certificate_refusal(stderr, f"the package source ({sources.describe()})")) is not None:
        return refusal
    if not cause and _NETWORK.search(stderr):
        return PackageError(
            "network",
            f"could not reach the package source ({sources.describe()}): {_error_text(stderr)}. "
            "The server's network or proxy settings (HTTPS_PROXY) need fixing before packages can be installed "
            "(a desktop client passes them only from the env block of its server config: see docs/troubleshooting.md).",
        )
    if m := _SDIST_ONLY.search(cause):
        name = m.group(1)
        return PackageError(
            "sdist_refused",
            f"{name} has no wheel (prebuilt package) that fits, only source code; building it would run "
            "its build scripts and this server installs wheels only (--allow-sdist is off). Ask for a "
            f"version of {name} that has a wheel, or use another package.",
        )
    if m := _NO_TAGS.search(cause):
        what = hint or detail
        return PackageError(
            "no_wheel",
            f"{m.group(1)} has no wheel for this platform (no matching {m.group(2)}): {what}. "
            "Ask for another version, or use a pure-Python alternative.",
        )
    if m := _REQUIRES_PYTHON.search(stderr):
        return PackageError(
            "no_wheel",
            f"the versions that fit need {m.group(2)}, but the sandbox runs Python {m.group(1)}: {detail}. "
            "Ask for an older version that supports this Python.",
        )
    pinned = dict.fromkeys(canonicalize_name(name) for name, _ in _PIN.findall(cause + " "))
    clashes = [available[key] for key in pinned if key in available]
    if clashes and "you require" in cause and " and " in cause:
        have = ", ".join(f"{d.name} {d.version}" for d in clashes)
        return PackageError(
            "conflict",
            f"{detail} ({have} {'is' if len(clashes) == 1 else 'are'} already installed in this session's "
            "Python and cannot be replaced while it runs.) Ask for a version that works with "
            f"{'it' if len(clashes) == 1 else 'them'}.",
        )
    if m := _NOT_FOUND.search(cause):
        name = m.group(1)
        suggestion = published_as(name)
        tip = f" The package you import as {name} is published as {suggestion!r}." if suggestion else ""
        return PackageError(
            "not_found",
            f"no package named {name!r} was found ({sources.describe()}).{tip} Check the spelling "
            "(the name on PyPI, which can differ from the name you import).",
        )
    if m := _NO_VERSION.search(cause + " "):
        return PackageError(
            "not_found",
            f"no version of {m.group(1)} matches {m.group(2)}{m.group(3)} ({sources.describe()}). "
            "Ask for another version, or for the package without a version to get the newest one.",
        )
    if _NETWORK.search(stderr):
        return PackageError(
            "network", f"could not reach the package source ({sources.describe()}): {detail}."
        )
    return PackageError("installer", f"the installer failed: {detail}" + (f" Hint: {hint}" if hint else ""))

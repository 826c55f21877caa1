"""What settings are declared with: their group, how they appear outside Python, and the form of
an origin.

Design: a field may carry a ``Cli(...)`` annotation, read by settings_cli.py and settings_docs.py;
kept apart from ``config.py`` so declaring settings needs nothing else. Error policy:
``normal_origin`` answers None for what is not an origin; the caller refuses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Group(StrEnum):
    """Which part of kernmind a setting shapes; each subcommand takes some groups."""

    STORAGE = "storage"
    EXECUTION = "execution"
    SANDBOX = "sandbox"
    TRANSPORT = "transport"
    PRINCIPALS = "principals"
    MEMORY = "memory"
    LOGGING = "logging"


@dataclass(frozen=True)
class Cli:
    """How a setting appears outside Python (a field without one: ``execution`` group, default flag)."""

    group: Group = Group.EXECUTION
    flag: str | None = None  # default: --field-name
    short: str | None = None  # a one-letter alias of the flag (``-q``)
    metavar: str | None = None
    shown_default: str | None = None  # Markdown: how the docs and --help show a computed default
    env_only: bool = False  # no flag (secrets); the KERNMIND_* variable still works
    repeatable: bool = False  # a list given as the flag once per item (the variable: JSON or commas)


def normal_origin(origin: str) -> str | None:
    """An origin as the HTTP guard compares it (``scheme://host[:port]``, lower case, no default
    port), or None when it is not one."""
    match = re.fullmatch(
        r"(https?)://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(\d{1,5}))?", origin.strip(), flags=re.IGNORECASE
    )
    if match is None:
        return None
    scheme, host, port = match.group(1).lower(), match.group(2).lower(), match.group(3)
    if port is not None:
        number = int(port)
        if number > 65535:
            return None
        port = None if (scheme, number) in (("http", 80), ("https", 443)) else str(number)
    return f"{scheme}://{host}" + (f":{port}" if port else "")

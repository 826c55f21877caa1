"""Database locations as they may be shown: in logs, ``kernmind doctor`` and error messages.

Memory and the shared session registry both open PostgreSQL URLs; this leaf module is what
they share, so neither reaches into the other's package.
"""

from __future__ import annotations

import re


def redacted_location(location: str) -> str:
    """A database URL with its password replaced by ``***`` (for logs and ``kernmind doctor``)."""
    return re.sub(r"^([a-z]+://[^:/@]*:)[^@]*@", r"\1***@", location)

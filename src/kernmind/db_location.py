"""Database locations as they may be shown (logs, ``kernmind doctor``, errors): a leaf module, so
memory and the shared session registry need not reach into each other's package.
"""

from __future__ import annotations

import re


def redacted_location(location: str) -> str:
    """A database URL with its password replaced by ``***`` (for logs and ``kernmind doctor``)."""
    return re.sub(r"^([a-z]+://[^:/@]*:)[^@]*@", r"\1***@", location)

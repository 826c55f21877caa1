"""Refusals: the errors a caller can act on, one family for the whole server.

Design
------
A :class:`Refusal` is an exception whose ``str()`` is one sentence for the caller (a model,
a person): what was wrong and what to do instead. Every part raises its own kind, and only
the error boundary (``boundary.py``) turns them into tool errors or resource errors, once,
around ``tools/call`` and ``resources/read``. Anything that is not a refusal is a fault of
the server: the boundary answers it with ``internal error (ref …)`` and logs the traceback
under that ref, never blaming the caller's arguments.

The family (each part subclasses the base it means; nothing here imports a part)::

    Refusal                         the caller can act on it
    ├── ArgumentRefusal             an argument the tool cannot accept (beyond its schema)
    ├── Unavailable                 not possible right now: try again shortly, or ask the operator
    ├── memory.errors.MemoryRefusal         a memory request, in each surface's own words
    ├── execution.errors.SessionError       sessions (ids, caps, a session in use elsewhere)
    ├── execution.workspace.WorkspaceError  paths and files of a session
    ├── execution.jobs.JobError             background jobs
    ├── execution.packages.PackageError     installs
    └── diskio.StorageError                 a write the disk could not take (full, failing, read-only)

The execution refusals and ``StorageError`` are also ``ValueError`` for code that catches
them by that name; the boundary itself catches ``Refusal`` only, never ``ValueError``.

``missing = True`` marks a refusal that says the thing asked for does not exist; a
resource read answers it as "not found" (JSON-RPC invalid params) rather than a failure.

Error policy
------------
This module defines the errors; it raises nothing itself.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the caller can act on; ``str(refusal)`` says how. Nothing was changed."""

    missing: bool = False  # the thing asked for does not exist (a resource read says "not found")

    def sentence(self) -> str:
        """The text the caller reads."""
        return str(self)


class ArgumentRefusal(Refusal, ValueError):
    """An argument the tool cannot accept, although it passed the tool's schema."""


class Unavailable(Refusal):
    """The request is fine but cannot be served right now (starting, stopping, an interpreter
    that cannot start): the sentence says whether to try again or to ask the operator."""

"""Refusals: the errors a caller can act on, one family for the whole server.

Design: a ``Refusal``'s ``str()`` is one sentence for the caller (a model, a person): what was
wrong and what to do instead. Every part raises its own subclass (``ArgumentRefusal``,
``Unavailable``, ``memory.errors.MemoryRefusal``, ``execution.errors.SessionError``,
``WorkspaceError``, ``JobError``, ``PackageError``, ``diskio.StorageError``; nothing here imports a
part), and only the error boundary (boundary.py) turns them into tool, resource or prompt errors;
anything else is a fault of the server. The execution refusals and ``StorageError`` are also
``ValueError``; the boundary catches ``Refusal`` only. ``missing = True`` marks a refusal saying
the thing asked for does not exist (a resource read answers "not found").

Error policy: this module defines the errors; it raises nothing itself.
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

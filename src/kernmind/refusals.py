"""Refusals: the errors a caller can act on, one family for the whole server.

Design: a ``Refusal``'s ``str()`` is one sentence: what was wrong and what to do; only boundary.py
turns them into client errors. ``missing = True`` marks a "not found". Error policy: raises nothing.
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

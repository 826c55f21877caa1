"""Exceptions shared across the execution package (kept apart so any module can import them)."""

from kernmind.refusals import Refusal


class RuntimeUnavailable(RuntimeError):
    """A language's interpreter could not be started: the operator must act (``kernmind doctor``)."""


class SessionError(Refusal, ValueError):
    """A session request the model can correct (bad id, caps, a session in use elsewhere)."""

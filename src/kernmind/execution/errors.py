"""Exceptions shared across the execution package (kept apart so any module can import them)."""


class RuntimeUnavailable(RuntimeError):
    """A language's interpreter could not be started: the operator must act (``kernmind doctor``)."""

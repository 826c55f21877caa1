"""The agent's two failures a user sees, importable without the openai or mcp packages.

Error policy: ``ConfigError`` (the CLI exits 2) and ``ModelError`` (exits 1) carry one sentence
that says what to check.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration the agent cannot use (bad mcp.json, no API key …)."""


class ModelError(RuntimeError):
    """The model endpoint failed in a way retrying did not (or could not) fix."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        images_rejected: bool = False,
        context_exceeded: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.images_rejected = images_rejected
        self.context_exceeded = context_exceeded  # the request was longer than the model's window

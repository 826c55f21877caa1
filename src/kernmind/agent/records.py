"""What the agent loop reports: each tool call, each turn's result, and the hooks it calls.

Design: dataclasses for the ``--json`` transcript; ``AgentEvents``' hooks are no-ops by default.
Error policy: none (no I/O).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kernmind.agent.model import AssistantTurn
from kernmind.agent.window import Compaction

StopReason = Literal["answer", "max_steps", "interrupted"]
CallStatus = Literal["ok", "error", "refused", "cancelled"]


@dataclass
class ToolCallRecord:
    """One tool call: what the model asked for and what came back."""

    id: str
    name: str
    raw_arguments: str
    step: int
    arguments: dict[str, Any] | None = None
    status: CallStatus = "ok"
    output: str = ""
    images: int = 0
    duration_s: float = 0.0
    _images: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_images", None)
        return data


@dataclass
class TurnResult:
    """The outcome of one user turn."""

    answer: str
    stopped: StopReason
    steps: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    compactions: int = 0  # times the conversation was compacted during this turn

    def to_json(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "stopped": self.stopped,
            "steps": self.steps,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "compactions": self.compactions,
        }


class AgentEvents:
    """Hooks for what the loop does; override what you need (all are no-ops by default)."""

    async def on_step(self, step: int) -> None: ...

    async def on_token(self, text: str) -> None: ...

    async def on_assistant(self, turn: AssistantTurn, step: int) -> None: ...

    async def on_retry(self, attempt: int, delay: float, reason: str) -> None: ...

    async def approve(self, call: ToolCallRecord) -> bool:
        """Whether this tool call may run (the CLI asks the user when ``--approve``)."""
        return True

    async def on_tool_start(self, call: ToolCallRecord) -> None: ...

    async def on_tool_progress(
        self, call: ToolCallRecord, progress: float, total: float | None, message: str | None
    ) -> None: ...

    async def on_tool_end(self, call: ToolCallRecord) -> None: ...

    async def on_max_steps(self, steps: int) -> None: ...

    async def on_compaction(self, compaction: Compaction) -> None:
        """The conversation was compacted to fit the model's window (the CLI notes it on stderr)."""

    async def on_notice(self, text: str) -> None:
        """Something the user should know that is not an error (the CLI prints it on stderr)."""

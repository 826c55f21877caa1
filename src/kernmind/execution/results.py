"""The result of one ``run_code`` call, shared by every language runner.

``RunResult`` is what clients get as ``structuredContent`` (its JSON schema is the tool's
``outputSchema``). ``OutputCollector`` assembles it while code runs and enforces the
output budget: every piece of text (stdout, stderr, result reprs, tracebacks) is charged
against one budget per call; once it is spent, the collector keeps a bounded tail and
counts what it dropped, so printing 100 MB costs the server a fixed amount of memory.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "error", "timeout"]

ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")

# Rich MIME types we pass through, keyed by the field name in RunResult.results.
MIME_FIELDS: dict[str, str] = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/svg+xml": "svg",
    "text/html": "html",
    "application/json": "json",
    "text/markdown": "markdown",
    "text/latex": "latex",
}


# Written by the kernel's output cap (kernel_setup.py) where it dropped output.
KERNEL_DROP_RE = re.compile(r"\n… \[kernel dropped (\d+) characters of output\] …\n")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


class DisplayResult(BaseModel):
    """One rich output: the last expression's value or a display. ``text`` is always set."""

    text: str = ""
    png: str | None = Field(default=None, description="base64 PNG")
    jpeg: str | None = Field(default=None, description="base64 JPEG")
    svg: str | None = None
    html: str | None = None
    json_: dict[str, Any] | list[Any] | None = Field(default=None, alias="json", serialization_alias="json")
    markdown: str | None = None
    latex: str | None = None
    is_main_result: bool = Field(default=False, description="true for the value of the last expression")

    model_config = {"populate_by_name": True}


class Logs(BaseModel):
    stdout: list[str] = Field(default_factory=list)
    stderr: list[str] = Field(default_factory=list)


class ErrorInfo(BaseModel):
    name: str
    value: str
    traceback: str = ""


class FileInfo(BaseModel):
    path: str = Field(description="relative to the session's working directory")
    size: int
    mime: str


class RunResult(BaseModel):
    status: Status
    language: str
    session_id: str | None
    execution_count: int | None = None
    results: list[DisplayResult] = Field(default_factory=list)
    logs: Logs = Field(default_factory=Logs)
    error: ErrorInfo | None = None
    files: list[FileInfo] = Field(default_factory=list)
    duration_ms: float = 0.0
    truncated: bool = False
    state_preserved: bool | None = Field(
        default=None, description="after a timeout or crash: whether the session kept its variables"
    )
    notes: list[str] = Field(default_factory=list, description="things the caller should know")


class OutputCollector:
    """Collects a call's output under a character budget (head kept whole, then a tail).

    Text past the budget goes to a bounded tail buffer; when the call ends, a marker
    saying how much was dropped is placed between head and tail.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.head_budget = budget * 3 // 4
        self.tail_budget = budget - self.head_budget
        self.used = 0
        self.dropped = 0
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.results: list[DisplayResult] = []
        self.error: ErrorInfo | None = None
        self._tails: dict[str, str] = {}
        self.last_line = ""
        self.started = time.perf_counter()

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def _take(self, text: str) -> str:
        """Charge ``text`` to the head budget; return what fits (the rest goes to the tail)."""
        room = self.head_budget - self.used
        if room <= 0:
            return ""
        part = text[:room]
        self.used += len(part)
        return part

    def _to_tail(self, stream: str, text: str) -> None:
        # One tail per stream: stdout and stderr flush independently, so a shared tail in
        # arrival order could lose one stream's ending entirely.
        kept = self._tails.get(stream, "") + text
        if len(kept) > self.tail_budget:
            self.dropped += len(kept) - self.tail_budget
            kept = kept[-self.tail_budget :]
        self._tails[stream] = kept

    def stream(self, name: str, text: str) -> None:
        if "kernel dropped" in text:  # fold the kernel's count into ours: one accurate marker
            text = KERNEL_DROP_RE.sub(self._count_kernel_drop, text)
        if not text:
            return
        stripped = text.rstrip("\n")
        if stripped:
            self.last_line = stripped.rsplit("\n", 1)[-1][-200:]
        kept = self._take(text)
        if kept:
            self._append(name, kept)
        if len(kept) < len(text):
            self._to_tail(name, text[len(kept) :])

    def _count_kernel_drop(self, match: re.Match[str]) -> str:
        self.dropped += int(match.group(1))
        return ""

    def _append(self, name: str, text: str) -> None:
        target = self.stdout if name == "stdout" else self.stderr
        # Merge consecutive chunks of one stream from a single flush into one entry, so
        # a loop of tiny prints doesn't become thousands of list items.
        if target and not target[-1].endswith("\n") and len(target[-1]) < 4096:
            target[-1] += text
        else:
            target.append(text)

    def display(self, data: dict[str, object], *, main: bool = False) -> None:
        """Add a MIME bundle. Binary images are not charged to the text budget, but capped."""
        text = str(data.get("text/plain", ""))
        result = DisplayResult(text=self._clip(text), is_main_result=main)
        for mime, field in MIME_FIELDS.items():
            if mime in data:
                value = data[mime]
                if isinstance(value, str) and field not in ("png", "jpeg"):
                    value = self._clip(value)
                elif isinstance(value, str) and len(value) > 20 * self.budget:
                    self.dropped += len(value)
                    continue
                if field == "json" and not isinstance(value, dict | list):
                    value = {"value": value}  # the schema promises an object or array
                setattr(result, field if field != "json" else "json_", value)
        if not text and "text/plain" not in data:
            result.text = self._describe(data)
        self.results.append(result)

    @staticmethod
    def _describe(data: dict[str, object]) -> str:
        kinds = ", ".join(sorted(data)) or "no data"
        return f"<display: {kinds}>"

    def _clip(self, text: str) -> str:
        kept = self._take(text)
        if len(kept) < len(text):
            self.dropped += len(text) - len(kept)
            return kept + f"\n… [{len(text) - len(kept)} characters truncated]"
        return kept

    def set_error(self, name: str, value: str, traceback: str) -> None:
        tb = strip_ansi(traceback)
        if len(tb) > self.tail_budget * 2:
            cut = len(tb) - self.tail_budget * 2
            tb = tb[: self.tail_budget] + f"\n… [{cut} characters truncated] …\n" + tb[-self.tail_budget :]
            self.dropped += cut
        self.error = ErrorInfo(name=name, value=strip_ansi(value)[:2000], traceback=tb)

    def logs(self) -> Logs:
        """The logs: each stream's head, then (if anything was cut) a marker and its tail."""
        stdout, stderr = list(self.stdout), list(self.stderr)
        if self.dropped:
            # The tail budget is shared by the streams that have a tail.
            share = self.tail_budget // max(1, len(self._tails))
            tails = {name: text[-share:] for name, text in self._tails.items()}
            dropped = self.dropped + sum(len(self._tails[n]) - len(t) for n, t in tails.items())
            marker = f"\n… [output truncated: {dropped} characters dropped] …\n"
            for name in tails or {"stdout": ""}:
                (stdout if name == "stdout" else stderr).append(marker)
            for name, text in tails.items():
                (stdout if name == "stdout" else stderr).append(text)
        return Logs(stdout=stdout, stderr=stderr)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 2)

"""Terminal side of the agent: activity on stderr, streamed tokens, approvals, line input.

Design: answers on stdout, everything else on stderr; ``LineReader`` reads stdin on one thread
serving requests in order, so a prompt abandoned by Ctrl-C never races a later one.
Error policy: output is best effort; end of input at an approval prompt counts as "no".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sys
import threading
from typing import Any, TextIO

import anyio

from kernmind.agent.model import AssistantTurn
from kernmind.agent.records import AgentEvents, ToolCallRecord, TurnResult
from kernmind.agent.window import Compaction

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class LineReader:
    """``await reader.readline(prompt)`` → a line without its newline, or ``None`` at EOF."""

    def __init__(self, stream: TextIO | None = None, prompt_stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdin
        self._prompt_stream = prompt_stream or sys.stderr
        self._requests: queue.Queue[tuple[str, asyncio.AbstractEventLoop, asyncio.Future[str | None]]] = (
            queue.Queue()
        )
        self._pending: list[str | None] = []  # lines that arrived for abandoned requests
        self._thread: threading.Thread | None = None
        self._eof = False
        self._interactive = self._stream is sys.stdin and _isatty(sys.stdin) and _isatty(sys.stdout)

    def _worker(self) -> None:
        while True:
            prompt, loop, fut = self._requests.get()
            value: str | None
            try:
                if self._interactive:
                    value = input(prompt)  # line editing and history through readline
                else:
                    if prompt:
                        self._prompt_stream.write(prompt)
                        self._prompt_stream.flush()
                    line = self._stream.readline()
                    value = line.rstrip("\r\n") if line else None
            except (OSError, ValueError, EOFError):
                value = None
            loop.call_soon_threadsafe(self._deliver, fut, value)
            if value is None:
                return

    def _deliver(self, fut: asyncio.Future[str | None], value: str | None) -> None:
        if fut.cancelled():
            self._pending.append(value)
        else:
            fut.set_result(value)

    async def readline(self, prompt: str = "") -> str | None:
        if self._pending:
            return self._pending.pop(0)
        if self._eof:
            return None
        if self._thread is None:
            if self._interactive:
                with contextlib.suppress(ImportError):
                    import readline  # noqa: F401  (enables editing for input())
            self._thread = threading.Thread(target=self._worker, name="kernmind-stdin", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()
        self._requests.put((prompt, loop, fut))
        value = await fut
        if value is None:
            self._eof = True
        return value


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def summarize_args(args: dict[str, Any] | None, raw: str, limit: int = 160) -> str:
    text = json.dumps(args, ensure_ascii=False) if args is not None else raw
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(text: str, limit: int = 120) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


class ConsoleEvents(AgentEvents):
    def __init__(
        self,
        *,
        stream_tokens: bool = False,
        approve: bool = False,
        reader: LineReader | None = None,
        quiet: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.stream_tokens = stream_tokens
        self.ask_approval = approve
        self.always: set[str] = set()
        self.reader = reader or LineReader()
        self.quiet = quiet
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tty = self.err.isatty()
        self._running: dict[str, tuple[ToolCallRecord, float, str]] = {}
        self._spinner_task: asyncio.Task[None] | None = None
        self._spinner_shown = False
        self._last_progress: dict[str, str] = {}
        self.tokens_written = False  # tokens of the current model turn are on stdout
        self.answer_streamed = False  # the last finished turn was an answer, streamed to stdout

    # ----- output helpers ---------------------------------------------------------

    def note(self, text: str) -> None:
        """A line of activity on stderr (clears the spinner first)."""
        self._clear_spinner()
        try:
            self.err.write(text + "\n")
            self.err.flush()
        except (OSError, ValueError):
            pass

    def _clear_spinner(self) -> None:
        if self._spinner_shown:
            self.err.write("\r\x1b[K")
            self._spinner_shown = False

    async def _spin(self) -> None:
        i = 0
        while self._running:
            now = anyio.current_time()
            parts = []
            for rec, started, message in self._running.values():
                extra = f": {message}" if message else ""
                parts.append(f"{rec.name} {now - started:.1f}s{extra}")
            line = f"{SPINNER[i % len(SPINNER)]} {', '.join(parts)}  (Ctrl-C cancels)"
            width = 100
            self.err.write("\r\x1b[K" + line[:width])
            self.err.flush()
            self._spinner_shown = True
            i += 1
            await anyio.sleep(0.1)
        self._clear_spinner()
        self.err.flush()

    # ----- AgentEvents ------------------------------------------------------------

    async def on_token(self, text: str) -> None:
        if self.stream_tokens:
            self._clear_spinner()
            self.out.write(text)
            self.out.flush()
            self.tokens_written = True

    def show_answer(self, result: TurnResult) -> None:
        """End a turn on stdout: the answer, unless its tokens were streamed there already."""
        if self.tokens_written:  # a streamed turn cut short
            self.out.write("\n")
            self.tokens_written = False
        if result.stopped == "answer" and not self.answer_streamed:
            self.out.write(result.answer + "\n")
        self.answer_streamed = False
        self.out.flush()

    async def on_assistant(self, turn: AssistantTurn, step: int) -> None:
        self.answer_streamed = self.stream_tokens and self.tokens_written and not turn.tool_calls
        if self.stream_tokens and self.tokens_written:
            self.out.write("\n")
            self.out.flush()
            self.tokens_written = False
        elif turn.tool_calls and turn.content.strip() and not self.quiet:
            self.note(f"· {turn.content.strip()}")

    async def on_retry(self, attempt: int, delay: float, reason: str) -> None:
        self.note(f"! model request failed ({reason}); retrying in {delay:.1f}s (attempt {attempt + 1})")

    async def approve(self, call: ToolCallRecord) -> bool:
        if not self.ask_approval or call.name in self.always:
            return True
        self.note(f"? {call.name} {summarize_args(call.arguments, call.raw_arguments, 400)}")
        while True:
            answer = await self.reader.readline("  run it? [y]es / [n]o / [a]lways for this tool: ")
            if answer is None:
                self.note("  (no input: not approved)")
                return False
            choice = answer.strip().lower()
            if choice in ("y", "yes"):
                return True
            if choice in ("n", "no"):
                return False
            if choice in ("a", "always"):
                self.always.add(call.name)
                return True

    async def on_tool_start(self, call: ToolCallRecord) -> None:
        if not self.quiet:
            self.note(f"→ {call.name} {summarize_args(call.arguments, call.raw_arguments)}")
        self._running[call.id] = (call, anyio.current_time(), "")
        if self.tty and not self.quiet and (self._spinner_task is None or self._spinner_task.done()):
            self._spinner_task = asyncio.get_running_loop().create_task(self._spin())

    async def on_tool_progress(
        self, call: ToolCallRecord, progress: float, total: float | None, message: str | None
    ) -> None:
        if call.id in self._running:
            rec, started, _ = self._running[call.id]
            self._running[call.id] = (rec, started, message or "")
        if not self.tty and not self.quiet and message and self._last_progress.get(call.id) != message:
            self._last_progress[call.id] = message
            self.note(f"  … {call.name}: {message}")

    async def on_tool_end(self, call: ToolCallRecord) -> None:
        self._running.pop(call.id, None)
        self._last_progress.pop(call.id, None)
        if not self._running:
            self._clear_spinner()
        if self.quiet:
            return
        mark = {"ok": "✓", "error": "✗", "refused": "⊘", "cancelled": "⊘"}[call.status]
        timing = f" {call.duration_s:.2f}s" if call.duration_s else ""
        label = {"refused": " refused", "cancelled": " cancelled"}.get(call.status, "")
        detail = first_line(call.output)
        images = f" [+{call.images} image(s)]" if call.images else ""
        self.note(f"{mark} {call.name}{label}{timing}{': ' + detail if detail else ''}{images}")

    async def on_max_steps(self, steps: int) -> None:
        self.note(f"! stopped after {steps} steps (--max-steps) without a final answer")

    async def on_compaction(self, compaction: Compaction) -> None:
        self.note(describe_compaction(compaction))

    async def on_notice(self, text: str) -> None:
        self.note(f"! {text}")


def describe_compaction(c: Compaction) -> str:
    """``compacted 14 messages into a summary; 3,100 of 8,000 tokens`` (and what else happened)."""
    fill = f"{c.after:,} of {c.window:,} tokens"
    cut = f"{c.shortened} tool result{'s' if c.shortened != 1 else ''}"
    if c.evicted and c.summarized:
        what = f"compacted {c.evicted} messages into a summary"
    elif c.evicted:
        what = f"compacted {c.evicted} messages into a note of what was dropped ({c.note})"
    elif c.shortened:
        what = f"shortened {cut} to fit the context window"
    else:
        what = "could not make the conversation shorter"
    if c.evicted and c.shortened:
        what += f" and shortened {cut}"
    why = "" if c.reason == "threshold" else f" ({c.reason})"
    return f"{what}; {fill}{why}"

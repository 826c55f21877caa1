"""The result of one ``run_code`` call, shared by every language runner.

Design (the budgets as a caller sees them: docs/tools.md, "run_code")
- ``RunResult`` is the ``structuredContent`` (its JSON schema the tool's ``outputSchema``).
- ``OutputCollector.of(settings)`` collects one call under its budgets: text against the
  ``Budget`` of ``--max-output-chars`` (a head kept whole, then a bounded tail per stream, so
  100 MB of prints cost a fixed amount of memory; cuts marked with ``budget.gap``), rich data
  against ``--max-result-bytes`` (what does not fit keeps its text form and a note).
- Anything code produces becomes valid JSON: lone surrogates are escaped, JSON nested deeper
  than ``MAX_JSON_DEPTH`` is cut to a string.

Error policy: nothing here raises for what code printed; what is left out is said in the notes.
"""

from __future__ import annotations

import json
import math
import re
import time
from html.parser import HTMLParser
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from kernmind.budget import Budget, gap
from kernmind.execution import kept_output, plotly_result

Status = Literal["ok", "error", "timeout", "running"]

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


MAX_JSON_DEPTH = 32
IMAGE_FIELDS = {"png": "image/png", "jpeg": "image/jpeg"}

# Written by the kernel's output cap (kernels/setup.py) where it dropped output.
KERNEL_DROP_RE = re.compile(r"\n… \[kernel dropped (\d+) characters of output\] …\n")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def safe_text(text: str) -> str:
    """``text`` as something UTF-8 can carry: lone surrogates become visible escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def safe_json(value: Any, depth: int = 0) -> Any:
    """A JSON value with safe strings, cut to a string below ``MAX_JSON_DEPTH`` levels."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict | list) and depth >= MAX_JSON_DEPTH:
        return f"<nested deeper than {MAX_JSON_DEPTH} levels: {safe_text(_preview(value))}>"
    if isinstance(value, dict):
        return {safe_text(str(k)): safe_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [safe_json(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    return value


def _preview(value: Any, limit: int = 200) -> str:
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        text = repr(type(value))
    return text[:limit] + ("…" if len(text) > limit else "")


class _TextOfHTML(HTMLParser):
    """The visible text of an HTML fragment, one line per block element or table row."""

    BLOCKS = frozenset({"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "table", "thead", "tbody"})

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _TextOfHTML()
    parser.feed(html)
    lines = (" ".join(line.replace("\t", " | ").split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line.strip(" |") for line in lines if line.strip(" |"))


DEFAULT_REPR_RE = re.compile(r"^<[\w.]+ object(?: at 0x[0-9a-f]+)?>$")
# HTML that shows more than words: these elements carry what a text form cannot.
RICH_HTML_RE = re.compile(r"<(script|img|svg|canvas|iframe|video|audio|object|embed|math|a)\b", re.I)
WORD_RE = re.compile(r"\w+")


def html_adds_to(text: str, html: str) -> bool:
    """Whether ``html`` shows more than ``text``: more than words (scripts, images, links…), or a
    word the text lacks (a pandas table's HTML usually does not: then only the text travels)."""
    if not text.strip() or DEFAULT_REPR_RE.match(text.strip()) or RICH_HTML_RE.search(html):
        return True
    return not set(WORD_RE.findall(html_to_text(html))) <= set(WORD_RE.findall(text))


class ImageRef(BaseModel):
    """Where an image went: it travels once, as an MCP image content block."""

    content_index: int = Field(description="index of the image block in the tool result's content")
    mime_type: str
    bytes: int = Field(description="size of the decoded image")


def _json_schema(schema: dict[str, Any]) -> None:
    item = {"anyOf": [{"type": t} for t in ("object", "array", "string", "number", "boolean", "null")]}
    schema["anyOf"] = [{"type": "object"}, {"type": "array", "items": item}, {"type": "null"}]


class DisplayResult(BaseModel):
    """One rich output: the last expression's value or a display. ``text`` is always set."""

    text: str = ""
    png: str | None = Field(default=None, description="base64 PNG")
    jpeg: str | None = Field(default=None, description="base64 JPEG")
    svg: str | None = None
    html: str | None = None
    json_: dict[str, Any] | list[Any] | None = Field(
        default=None,
        alias="json",
        serialization_alias="json",
        json_schema_extra=_json_schema,  # says what an item of the array may be (not an empty schema)
    )
    markdown: str | None = None
    latex: str | None = None
    is_main_result: bool = Field(default=False, description="true for the value of the last expression")
    image: ImageRef | None = Field(
        default=None, description="set when the png/jpeg travels as an image content block instead"
    )

    model_config = {"populate_by_name": True}

    def readable(self) -> str:
        """The text form, unless it is a default repr (``<…Markdown object>``) and a readable one exists."""
        if self.text and not DEFAULT_REPR_RE.match(self.text.strip()):
            return self.text
        if self.markdown or self.latex:
            return self.markdown or self.latex or ""
        if self.html:
            return html_to_text(self.html) or self.text
        return self.text


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
    session_id: str | None = None  # None: a stateless call
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
    job_id: str | None = Field(
        default=None, description="with background=true: the job to follow with job_status (status 'running')"
    )


# Keys the public contract names for every run_code result: kept even when null, so a client
# may read result["error"]; every other null is left out of the structured result.
CONTRACT_KEYS = ("session_id", "execution_count", "error")


def lean_dump(result: RunResult) -> dict[str, Any]:
    """The structured result a client reads: no null fields but the contract's own."""
    data = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in CONTRACT_KEYS:
        data.setdefault(key, None)
    return data


class CollectorSettings(Protocol):
    max_output_chars: int
    max_result_bytes: int


class OutputCollector:
    """Collects a call's output under its budgets (see the module's Design)."""

    def __init__(self, budget: Budget | int, rich_budget: int = 4 * 1024 * 1024) -> None:
        whole = budget if isinstance(budget, Budget) else Budget(budget)
        self.budget = whole.chars
        self.head_budget, self.tail_budget = whole.head_and_tail()
        self.rich_budget = rich_budget
        self.kept: dict[str, kept_output.Kept] = {}  # stream -> the file holding all of it
        self.keeper: kept_output.OutputFile | None = None  # a process runner's (kept_output.py)
        self.reset()

    @classmethod
    def of(cls, settings: CollectorSettings) -> OutputCollector:
        """The collector of one tool call (``run_code``, a background job) under ``settings``."""
        return cls(Budget.of(settings), settings.max_result_bytes)

    def reset(self) -> None:
        """Forget everything collected so far (a runner that starts the code over)."""
        self.head = Budget(self.head_budget)
        self.dropped = 0
        self.rich_used = 0
        self.rich_dropped: dict[str, int] = {}  # MIME type -> displays left out
        self.rich_dropped_bytes = 0
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.results: list[DisplayResult] = []
        self.error: ErrorInfo | None = None
        self._tails: dict[str, str] = {}
        self.last_line = ""
        self.started = time.perf_counter()
        self._clear_pending = False

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    @property
    def used(self) -> int:
        return self.head.used

    def _take(self, text: str) -> str:
        """Charge ``text`` to the head budget; return what fits (the rest goes to the tail)."""
        if not self.head.left:  # the usual case once output floods: no note to word
            return ""
        return self.head.take(text, more="")[0]

    def _to_tail(self, stream: str, text: str) -> None:
        # One tail per stream: stdout and stderr flush independently, so a shared tail in
        # arrival order could lose one stream's ending entirely.
        kept = self._tails.get(stream, "") + text
        if len(kept) > self.tail_budget:
            self.dropped += len(kept) - self.tail_budget
            kept = kept[-self.tail_budget :]
        self._tails[stream] = kept

    def stream(self, name: str, text: str) -> None:
        if self._clear_pending:
            self.clear()
        text = safe_text(text)
        if "kernel dropped" in text:  # fold the kernel's count into ours: one accurate marker
            text = KERNEL_DROP_RE.sub(self._count_kernel_drop, text)
        if "kernmind kept" in text:  # the kernel kept the cell's whole output in a file
            text = kept_output.KEPT_RE.sub(self._record_kept, text)
        if not text:
            return
        if self.keeper is not None:
            self.keeper.add(name, text)
        stripped = text.rstrip("\n")
        if stripped:
            self.last_line = stripped.rsplit("\n", 1)[-1][-200:]
        kept = self._take(text)
        if kept:
            self._append(name, kept)
        if len(kept) < len(text):
            self._to_tail(name, text[len(kept) :])

    def _record_kept(self, match: re.Match[str]) -> str:
        chars, stream, path, why = match.groups()
        self.kept[stream] = kept_output.Kept(path, int(chars), why)
        return ""

    def kept_note(self) -> str | None:
        """Where the whole output went when it was longer than the answer (for the notes)."""
        if self.keeper is not None:
            self.kept.update(self.keeper.close())
        return kept_output.note(self.kept)

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
        """Add a MIME bundle: text under the text budget, rich forms under the result budget (what
        does not fit is counted); a Plotly figure also as HTML and a summary (``plotly_result.py``)."""
        if self._clear_pending:
            self.clear()
        data = plotly_result.render(data)
        text = safe_text(str(data.get("text/plain", "")))
        result = DisplayResult(text=self._clip(text), is_main_result=main)
        for mime, field in MIME_FIELDS.items():
            if mime not in data:
                continue
            if field == "html" and not html_adds_to(text, str(data[mime])):
                continue  # the text form says it all: the HTML would only double the result
            value = safe_json(data[mime])
            if field == "json" and not isinstance(value, dict | list):
                value = {"value": value}  # the schema promises an object or array
            size = len(value) if isinstance(value, str) else len(json.dumps(value))
            if self.rich_used + size > self.rich_budget:
                self.rich_dropped[mime] = self.rich_dropped.get(mime, 0) + 1
                self.rich_dropped_bytes += size
                continue
            self.rich_used += size
            setattr(result, field if field != "json" else "json_", value)
        if not text and "text/plain" not in data:
            result.text = self._describe(data)
        self.results.append(result)

    def clear(self, *, wait: bool = False) -> None:
        """The code's ``clear_output()``: forget the output so far, its budget given back (``wait``:
        at the next output, as a redrawing progress display does); the error and start time stay."""
        if wait:
            self._clear_pending = True
            return
        error, started, last_line = self.error, self.started, self.last_line
        self.reset()
        self.error, self.started, self.last_line = error, started, last_line

    def omitted_note(self) -> str | None:
        """What the result budget left out, and how to get it, for the result's notes."""
        if not self.rich_dropped:
            return None
        counts = ", ".join(f"{n} {mime}" for mime, n in sorted(self.rich_dropped.items()))
        return (
            f"left out {counts} output(s) ({self.rich_dropped_bytes:,} characters) over this call's "
            f"result budget of {self.rich_budget:,} (--max-result-bytes); save them to files (e.g. "
            "plt.savefig) and fetch them with download_file, or produce fewer."
        )

    @staticmethod
    def _describe(data: dict[str, object]) -> str:
        kinds = ", ".join(sorted(data)) or "no data"
        return f"<display: {kinds}>"

    def _clip(self, text: str) -> str:
        kept = self._take(text)
        if len(kept) < len(text):
            self.dropped += len(text) - len(kept)
            return kept + gap(len(text) - len(kept), "result").rstrip("\n")
        return kept

    def set_error(self, name: str, value: str, traceback: str) -> None:
        """The code's exception; its traceback keeps both ends within half the output budget or
        what the head left (at least a quarter); the output's tail gives way to it in ``logs``."""
        name, value, whole = safe_text(name)[:200], safe_text(value), safe_text(strip_ansi(traceback))
        room = min(self.budget // 2, self.budget - self.head.used)
        tb, cut = Budget(room).take(whole, more="", keep="ends")
        if cut is not None:
            self.dropped += len(whole) - len(tb)  # (the marker's own characters aside)
        value = Budget(2000).take(strip_ansi(value), more="")[0]
        self.error = ErrorInfo(name=name, value=value, traceback=tb)

    def logs(self) -> Logs:
        """The logs: each stream's head, then (if anything was cut) a marker and its tail."""
        stdout, stderr = list(self.stdout), list(self.stderr)
        if self.dropped:
            # The tail budget is shared by the streams that have a tail.
            # It gives way to a traceback: head, tails and traceback fit the one budget.
            traceback = len(self.error.traceback) if self.error is not None else 0
            room = max(0, min(self.tail_budget, self.budget - self.head.used - traceback))
            share = room // max(1, len(self._tails))
            tails = {name: text[len(text) - share :] for name, text in self._tails.items()}
            dropped = self.dropped + sum(len(self._tails[n]) - len(t) for n, t in tails.items())
            marker = gap(dropped)
            for name in tails or {"stdout": ""}:
                (stdout if name == "stdout" else stderr).append(marker)
            for name, text in tails.items():
                (stdout if name == "stdout" else stderr).append(text)
        return Logs(stdout=stdout, stderr=stderr)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 2)


def ago(seconds: float) -> str:
    """``seconds`` as "3 minutes ago"."""
    seconds = max(0.0, seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return f"{int(seconds)} seconds ago"

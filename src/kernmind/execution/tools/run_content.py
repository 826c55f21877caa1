"""``run_result_content``: what a ``RunResult`` looks like to a model, under the output budget.

Design: ``run_code``'s answer (and a finished job's) is a ``CallToolResult`` whose
``structuredContent`` is the lean ``RunResult`` (``lean_dump``) and whose content is one text
block (status, notes, output, rich results' readable form, traceback, changed files) and one
image block per image, which travels once (docs/tools.md, "run_code").

Error policy: none of its own: it shapes a result that is already whole. What does not fit
the budget is cut with a note saying where the whole of it is (the structured result).
"""

import itertools
import sys
from typing import Any

from mcp_types import ImageContent, TextContent

from kernmind.budget import Budget
from kernmind.budget import left_out as budget_left_out
from kernmind.execution.results import IMAGE_FIELDS, ImageRef, RunResult, lean_dump


def run_result_content(
    result: RunResult, budget: Budget | None = None
) -> tuple[list[TextContent | ImageContent], dict[str, Any]]:
    """The content blocks a model reads, and the structured result (images sent once). What the
    collector kept is already within ``budget`` and counted there; a rich result's readable form
    (Markdown, the text of HTML) and the changed files' paths get what is left of it."""
    budget = budget or Budget(sys.maxsize)
    lines: list[str] = []
    if result.status != "ok":
        lines.append(f"[status: {result.status}]")
    lines.extend(f"[note: {note}]" for note in result.notes)
    out, err = "".join(result.logs.stdout), "".join(result.logs.stderr)
    if out:
        lines.append(out.rstrip("\n"))
    if err:
        lines.append("[stderr]\n" + err.rstrip("\n"))
    budget.spend(sum(len(line) + 1 for line in lines))
    if result.error:  # (the collector's share of the budget: counted before the rich forms)
        budget.spend(len(result.error.traceback) or len(result.error.name) + len(result.error.value) + 2)
    images: list[ImageContent] = []
    # No null fields but the contract's: a client that hands the structured result to its model
    # pays for every one. The result itself is left as it is (its history line may still be
    # being written from it, books.py): the image references go into the structured copy.
    structured = lean_dump(result)
    for i, (r, row) in enumerate(zip(result.results, structured["results"], strict=True)):
        if text := r.readable():
            if text is r.text:
                budget.spend(len(text) + 1)
            else:
                form = next(f for f in ("markdown", "latex", "html") if getattr(r, f))
                text, cut = budget.take(
                    text, more=f"the whole {form} is in the structured result (results[{i}].{form})."
                )
                text += f"\n[{cut}]" if cut else ""
            lines.append(text)
        for field, mime in IMAGE_FIELDS.items():
            data = getattr(r, field)
            if data:
                images.append(ImageContent(type="image", data=data, mime_type=mime))
                size = len(data) * 3 // 4 - data[-2:].count("=")
                row["image"] = ImageRef(content_index=len(images), mime_type=mime, bytes=size).model_dump()
                row.pop(field, None)
    if result.error:
        lines.append(result.error.traceback or f"{result.error.name}: {result.error.value}")
    if result.files:
        named = [f"{f.path} ({f.size} B)" for f in result.files]
        shown = sum(1 for _ in itertools.takewhile(lambda n: budget.admit(len(n) + 2), named)) or 1
        lines.append("[files] " + ", ".join(named[:shown]))
        if shown < len(named):
            lines.append(
                f"[{budget_left_out(len(named) - shown, 'files', budget, 'the structured result lists them.')}]"
            )
    text = TextContent(type="text", text="\n".join(lines) or "(no output)")
    return [text, *images], structured

"""Pydantic validation errors as sentences a person or a model can act on: ``problem`` turns one into
``'timeout' must be a finite number, got 'NaN'`` (no model class names, no links; inputs shortened).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_core import ErrorDetails

MAX_SHOWN_INPUT = 60

_SENTENCES = {
    "missing": "is required",
    "extra_forbidden": "is not a known name",
    "finite_number": "must be a finite number (not NaN or infinity)",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
    "string_too_long": "must be at most {max_length} characters long",
    "too_long": "must have at most {max_length} items",
}


def shown(value: Any) -> str:
    """A short ``repr`` of an input value."""
    text = repr(value)
    if len(text) > MAX_SHOWN_INPUT:
        text = text[: MAX_SHOWN_INPUT - 5] + "…" + text[-4:]
    return text


def location(loc: Sequence[int | str]) -> str:
    """``('tags', 2)`` → ``tags[2]``; ``('a', 'b')`` → ``a.b``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problem(error: ErrorDetails) -> str:
    """What is wrong, without the subject: ``must be a number, got 'abc'``."""
    kind = error["type"]
    template = _SENTENCES.get(kind)
    if template is not None:
        text = template.format(**(error.get("ctx") or {}))
    else:
        msg = error["msg"]
        text = (
            "must" + msg[len("Input should") :]
            if msg.startswith("Input should")
            else msg[0].lower() + msg[1:]
        )
    if kind == "missing":
        return text
    if kind in ("string_too_long", "too_long"):  # the size says more than the start of it
        given = error["input"]
        size = len(given) if hasattr(given, "__len__") else "more"
        unit = "characters" if kind == "string_too_long" else "items"
        return f"{text}; this one has {size} {unit}: shorten it and call again (nothing was done)"
    return f"{text}, got {shown(error['input'])}"

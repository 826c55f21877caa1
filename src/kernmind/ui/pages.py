"""The HTML of the ``/ui`` pages: one layout, small helpers, every stored text escaped.

Design: no template engine; text enters HTML only through ``e`` (``html.escape`` with quotes).
Error policy: none of its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from html import escape
from urllib.parse import urlencode

from kernmind.principals import Principal


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def when(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return dt.datetime.fromtimestamp(float(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def size(n: int | float | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def url(path: str, **query: object) -> str:
    kept = {k: v for k, v in query.items() if v not in (None, "", False)}
    return path + ("?" + urlencode(kept) if kept else "")


def link(href: str, text: object, **attrs: str) -> str:
    extra = "".join(f' {k}="{e(v)}"' for k, v in attrs.items())
    return f'<a href="{e(href)}"{extra}>{e(text)}</a>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, id: str = "") -> str:
    """A table; cells are HTML already (built with ``e``/``link``)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{e(id)}"' if id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def post_form(
    action: str, csrf: str, button: str, fields: dict[str, object] | None = None, *, extra: str = ""
) -> str:
    """A form that POSTs to ``action`` with the CSRF token (and hidden ``fields``)."""
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
        for k, v in {**(fields or {}), "csrf": csrf}.items()
    )
    return f'<form class="inline" method="post" action="{e(action)}">{hidden}{extra}<button>{e(button)}</button></form>'


def score_bar(score: float | None) -> str:
    if score is None:
        return ""
    width = max(0, min(120, round(float(score) * 120)))
    return (
        f'<span class="barbox"><span class="bar score-bar" style="width:{width}px" '
        f'title="score {float(score):.3f}"></span></span>{float(score):.3f}'
    )


def pager(path: str, page: int, more: bool, total: int | None = None, per: int = 50, **query: object) -> str:
    parts = []
    if page > 0:
        parts.append(link(url(path, page=page - 1, **query), "← previous", rel="prev"))
    shown = f"page {page + 1}"
    if total is not None:
        shown += f" of {max(1, -(-total // per))} ({total} in all)"
    parts.append(f'<span class="muted">{e(shown)}</span>')
    if more:
        parts.append(link(url(path, page=page + 1, **query), "next →", rel="next"))
    return '<p class="pager">' + " ".join(parts) + "</p>"


def flash(message: str | None, ok: bool = False) -> str:
    if not message:
        return ""
    return f'<div class="flash{" ok" if ok else ""}" role="status">{e(message)}</div>'


def layout(
    title: str, body: str, who: Principal | None = None, *, head: str = "", script: bool = False
) -> str:
    nav = ""
    if who is not None:
        links = [
            link("/ui/memory/blocks", "Blocks"),
            link("/ui/memory/passages", "Passages"),
            link("/ui/memory/search", "Search"),
            link("/ui/sessions", "Sessions"),
            link("/ui/jobs", "Jobs"),
        ]
        if who.admin:
            links.append(link("/ui/principals", "Principals"))
        nav = "".join(links) + f'<span class="who">{e(who.name)} · {link("/ui/logout", "log out")}</span>'
    js = '<script src="/ui/static/job.js" defer></script>' if script else ""
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{e(title)} · kernmind</title>"
        '<link rel="stylesheet" href="/ui/static/ui.css">'
        f'{head}{js}</head><body><header><a href="/ui/">kernmind</a>{nav}</header>'
        f"<main><h1>{e(title)}</h1>{body}</main></body></html>"
    )

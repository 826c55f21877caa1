"""The memory pages: blocks, versions, diffs, undo; passages, search, delete, supersede (docs/ui.md).

Design: the memory package's public classes for the caller's own namespace, with the tools' checks;
paged on the server. Error policy: a refusal's sentence is shown on the page; nothing else is caught.
"""

from __future__ import annotations

import difflib
from typing import Any

from kernmind.memory.database import PassageFilter
from kernmind.memory.passages import check_thread, filter_sql
from kernmind.memory.records import PassageRow, time_range
from kernmind.principals import Principal
from kernmind.ui.data import NotFound, UiParts
from kernmind.ui.pages import e, flash, link, pager, post_form, score_bar, table, url, when

PER_PAGE = 50
HISTORY_KEPT = 200
SEARCH_K = 20


# --- blocks ---------------------------------------------------------------------------------------
async def blocks_page(parts: UiParts, who: Principal, page: int) -> str:
    store, _ = await parts.space(who)
    rows = await store.blocks.list(page * PER_PAGE, PER_PAGE + 1)
    total = await store.blocks.count()
    more, rows = len(rows) > PER_PAGE, rows[:PER_PAGE]
    body = table(
        ["label", "version", "chars / limit", "updated", "value (start)"],
        (
            [
                link(f"/ui/memory/blocks/{r.label}", r.label),
                e(r.version),
                e(f"{r.chars} / {r.limit}") + (" · read-only" if r.read_only else ""),
                e(when(r.updated_at)),
                f'<span class="text">{e(r.value[:160])}</span>',
            ]
            for r in rows
        ),
        id="blocks",
    )
    return body + pager("/ui/memory/blocks", page, more, total, PER_PAGE)


async def block_page(
    parts: UiParts, who: Principal, csrf: str, label: str, a: int | None, b: int | None, message: str = ""
) -> str:
    store, _ = await parts.space(who)
    async with store.db.read() as tx:
        found = await store.blocks.fetch(tx, label)
    if found is None:
        raise NotFound(label)
    row = found
    entries = await store.blocks.history(label, limit=HISTORY_KEPT)
    versions: dict[int, str] = {h.version: h.new_value for h in entries if h.new_value is not None}
    versions[row.version] = row.value
    known = sorted(versions)
    b = b if b in versions else row.version
    earlier = [v for v in known if v < b]
    a = a if a in versions else (earlier[-1] if earlier else b)
    options = "".join(f'<option value="{v}">{v}</option>' for v in reversed(known))

    def select(name: str, chosen: int) -> str:
        return (
            f'<select name="{name}">'
            + options.replace(f'value="{chosen}"', f'value="{chosen}" selected')
            + "</select>"
        )

    diff_form = (
        f'<form method="get" action="{e("/ui/memory/blocks/" + label)}">Compare version '
        f"{select('a', a)} with version {select('b', b)} <button>diff</button></form>"
    )
    body = flash(message)
    body += (
        f'<p>version <b id="block-version">{row.version}</b> · {row.chars} / {row.limit} chars'
        f"{' · read-only' if row.read_only else ''} · {e(row.description)}</p>"
        f'<pre class="text" id="block-value">{e(row.value)}</pre>'
    )
    body += (
        "<p>"
        + post_form(
            f"/ui/memory/blocks/{label}/undo",
            csrf,
            "Undo the last change",
            {"expected_version": row.version},
        )
        + ' <span class="muted">(refused if the block changed since this page was shown)</span></p>'
    )
    body += "<h2>Diff</h2>" + diff_form + diff_html(versions[a], versions[b], a, b)
    body += "<h2>History</h2>" + table(
        ["version", "operation", "when", "undone", "value after"],
        (
            [
                e(h.version),
                e(h.op),
                e(when(h.at)),
                "yes" if h.undone else "",
                f'<span class="text">{e((h.new_value or "")[:200])}</span>',
            ]
            for h in entries
        ),
        id="history",
    )
    return body


def diff_html(old: str, new: str, a: int, b: int) -> str:
    lines = list(
        difflib.unified_diff(old.splitlines(), new.splitlines(), f"version {a}", f"version {b}", lineterm="")
    )
    if not lines:
        return f'<p class="muted" id="diff">versions {a} and {b} hold the same text.</p>'
    out = []
    for line in lines:
        kind = "hdr" if line.startswith(("---", "+++", "@@")) else {"+": "add", "-": "rem"}.get(line[:1], "")
        out.append(f'<div class="{kind}">{e(line) or "&nbsp;"}</div>')
    return '<pre class="diff" id="diff">' + "".join(out) + "</pre>"


async def undo(parts: UiParts, who: Principal, label: str, expected_version: int | None) -> str:
    store, _ = await parts.space(who)
    result, entry = await store.blocks.undo(label, expected_version)
    if result is None:
        return f"Undid the creation of block {label!r}: it no longer exists."
    return f"Undid the {entry.op} that made version {entry.version}; the block is now at version {result.version}."


# --- passages ---------------------------------------------------------------------------------------
def passage_filter(start: str, end: str, thread: str, superseded: bool) -> PassageFilter:
    lo, hi = time_range(start or None, end or None)
    return PassageFilter((), "any", lo, hi, superseded, check_thread(thread or None))


def filters_form(action: str, q: dict[str, Any], with_query: bool = False) -> str:
    query = (
        f'<input type="search" name="q" value="{e(q.get("q", ""))}" placeholder="search memory" size="40" '
        'autofocus id="search-box">'
        if with_query
        else ""
    )
    checked = " checked" if q.get("superseded") else ""
    return (
        f'<form class="filters" method="get" action="{e(action)}">{query}'
        f'from <input type="text" name="start" value="{e(q.get("start", ""))}" placeholder="2024-01-31" size="12">'
        f'to <input type="text" name="end" value="{e(q.get("end", ""))}" placeholder="2024-12-31" size="12">'
        f'thread <input type="text" name="thread" value="{e(q.get("thread", ""))}" size="14">'
        f'<label><input type="checkbox" name="superseded" value="1"{checked}> include superseded</label> '
        "<button>show</button></form>"
    )


def passage_cells(r: PassageRow, *, scored: bool = False) -> list[str]:
    cls = ' class="text superseded"' if r.superseded_by is not None else ' class="text"'
    cells = [link(f"/ui/memory/passages/{r.id}", f"#{r.id}")]
    if scored:
        cells += [score_bar(r.score), e(r.match or "")]
    cells += [
        e(when(r.occurred_at)),
        (link(url("/ui/memory/passages", thread=r.thread), r.thread) + f" · {r.seq}") if r.thread else "",
        f"<span{cls}>{e(r.content[:400])}</span>"
        + "".join(f' <span class="tag">{e(t)}</span>' for t in r.tags),
        link(f"/ui/memory/passages/{r.superseded_by}", f"→ #{r.superseded_by}") if r.superseded_by else "",
    ]
    return cells


async def timeline_page(parts: UiParts, who: Principal, q: dict[str, Any], page: int) -> str:
    store, _ = await parts.space(who)
    where = passage_filter(
        q.get("start", ""), q.get("end", ""), q.get("thread", ""), bool(q.get("superseded"))
    )
    rows = await store.passages.browse(where, PER_PAGE + 1, page * PER_PAGE)
    more, rows = len(rows) > PER_PAGE, rows[:PER_PAGE]
    conditions, params = filter_sql(store.passages.namespace, where)
    async with store.db.read() as tx:
        found = await tx.one(f"SELECT count(*) FROM passages p WHERE 1 = 1{conditions}", tuple(params))
    total = int(found[0]) if found else 0
    order = "the thread's order" if where.thread else "when they happened (occurred_at), oldest first"
    body = filters_form("/ui/memory/passages", q)
    body += f'<p class="muted">Passages in {e(order)}.</p>'
    body += table(
        ["id", "occurred", "thread", "text", "superseded by"],
        (passage_cells(r) for r in rows),
        id="passages",
    )
    return body + pager("/ui/memory/passages", page, more, total, PER_PAGE, **q)


async def search_page(parts: UiParts, who: Principal, q: dict[str, Any], page: int) -> str:
    body = filters_form("/ui/memory/search", q, with_query=True)
    text = str(q.get("q", ""))
    if not text.strip():
        return (
            body
            + '<p class="muted">Type a question or words; results show their score and how they matched.</p>'
        )
    _, archive = await parts.space(who)
    outcome = await archive.search(
        text,
        top_k=SEARCH_K,
        page=page,
        start_datetime=q.get("start") or None,
        end_datetime=q.get("end") or None,
        include_superseded=bool(q.get("superseded")),
        thread=q.get("thread") or None,
    )
    body += f'<p class="muted">mode: {e(outcome.mode)}{" · " + e(outcome.note) if outcome.note else ""}</p>'
    body += table(
        ["id", "score", "match", "occurred", "thread", "text", "superseded by"],
        (passage_cells(r, scored=True) for r in outcome.results),
        id="results",
    )
    return body + pager("/ui/memory/search", page, len(outcome.results) == SEARCH_K, None, SEARCH_K, **q)


async def passage_page(parts: UiParts, who: Principal, csrf: str, passage_id: int, message: str = "") -> str:
    store, _ = await parts.space(who)
    row = (await store.passages.get([passage_id])).get(passage_id)
    if row is None:
        raise NotFound(str(passage_id))
    async with store.db.read() as tx:
        replaced = await tx.all(
            "SELECT id FROM passages WHERE namespace = ? AND superseded_by = ? ORDER BY id",
            (store.passages.namespace, passage_id),
        )
    chain: list[int] = []
    nxt = row.superseded_by
    while nxt is not None and len(chain) < 50 and nxt not in chain:
        chain.append(nxt)
        got = (await store.passages.get([nxt])).get(nxt)
        nxt = got.superseded_by if got is not None else None
    body = flash(message)
    body += (
        f"<p>occurred {e(when(row.occurred_at))} · stored {e(when(row.created_at))}"
        + (
            f" · thread {link(url('/ui/memory/passages', thread=row.thread), row.thread)} #{row.seq}"
            if row.thread
            else ""
        )
        + "".join(f' <span class="tag">{e(t)}</span>' for t in row.tags)
        + "</p>"
        f'<pre class="text" id="passage-content">{e(row.content)}</pre>'
    )
    body += "<h2>Supersede chain</h2><p>"
    body += (
        "replaces " + ", ".join(link(f"/ui/memory/passages/{r[0]}", f"#{r[0]}") for r in replaced)
        if replaced
        else "replaces nothing"
    )
    body += " · " + (
        "replaced by " + " → ".join(link(f"/ui/memory/passages/{i}", f"#{i}") for i in chain)
        if chain
        else "live (not superseded)"
    )
    body += "</p>"
    if row.thread:
        near = (await store.passages.neighbours([passage_id])).get(passage_id)
        if near is not None:
            body += "<p>in its thread: "
            body += (
                link(f"/ui/memory/passages/{near.previous.id}", f"← #{near.previous.id}")
                if near.previous
                else "first"
            )
            body += " · "
            body += link(f"/ui/memory/passages/{near.next.id}", f"#{near.next.id} →") if near.next else "last"
            body += "</p>"
    body += "<h2>Change</h2>"
    if row.superseded_by is None:
        body += (
            post_form(
                f"/ui/memory/passages/{passage_id}/supersede",
                csrf,
                "Supersede with this text",
                extra=f'<textarea name="content" rows="4" cols="80" required>{e(row.content)}</textarea><br>',
            )
            + "<br><br>"
        )
    body += post_form(f"/ui/memory/passages/{passage_id}/delete", csrf, "Delete this passage")
    return body


async def delete_passage(parts: UiParts, who: Principal, passage_id: int) -> str:
    _, archive = await parts.space(who)
    row, restored = await archive.delete(passage_id)
    note = f" Passages it had replaced are live again: {', '.join(map(str, restored))}." if restored else ""
    return f"Deleted passage {row.id}.{note}"


async def supersede_passage(parts: UiParts, who: Principal, passage_id: int, content: str) -> tuple[int, str]:
    store, archive = await parts.space(who)
    old = (await store.passages.get([passage_id])).get(passage_id)
    if old is None:
        raise NotFound(str(passage_id))
    outcome = await archive.insert(content, old.tags, supersedes=[passage_id], thread=old.thread)
    return outcome.id, f"Stored passage {outcome.id}, which supersedes passage {passage_id}." + (
        f" {outcome.note}" if outcome.note else ""
    )

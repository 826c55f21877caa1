"""The session pages: live and stored sessions, their files, each call's cost, their notebook; jobs.

Design: rows from ``UiParts`` (data.py), the caller's own only; a call's cost is its history line.
Error policy: ``NotFound`` for ids that are not the caller's; nothing else is caught here.
"""

from __future__ import annotations

import json
from typing import Any

import anyio

from kernmind.principals import Principal
from kernmind.ui.data import UiParts, ago
from kernmind.ui.pages import e, link, pager, size, table, when

FILES_PER_PAGE = 100
CALLS_PER_PAGE = 50
JOBS_SHOWN = 200


def quota_bar(used: int, limit: int) -> str:
    share = 0 if limit <= 0 else min(1.0, used / limit)
    return (
        f'<span class="quota" title="{share:.0%}"><span style="width:{round(share * 200)}px"></span></span> '
        f"{e(size(used))} of {e(size(limit))}"
    )


async def sessions_page(parts: UiParts, who: Principal) -> str:
    rows = await parts.sessions(who.owner)
    limit = parts.settings.workspace_mb << 20
    body = table(
        ["session", "state", "last used", "files", "size against quota", "packages", "variables saved"],
        (
            [
                link(f"/ui/sessions/{r['session_id']}", r["session_id"]),
                e(r.get("state"))
                + (" · busy" if r.get("busy") else "")
                + (f" · job {e(r['job_id'])}" if r.get("job_id") else ""),
                e(ago(r.get("last_used"))),
                e(r.get("workspace_files", "—")),
                quota_bar(int(r.get("workspace_bytes") or 0), limit),
                e(size(r.get("packages_bytes"))),
                e(when(r.get("variables_saved_at"))),
            ]
            for r in rows
        ),
        id="sessions",
    )
    return body + f'<p class="muted">{len(rows)} session(s).</p>'


def call_cost(entry: dict[str, Any]) -> list[str]:
    result = entry.get("result") or {}
    logs = result.get("logs") or {}
    out_chars = sum(len(t) for t in (logs.get("stdout") or []) + (logs.get("stderr") or []))
    error = result.get("error") or {}
    return [
        e(result.get("execution_count", "")),
        f'<pre class="text">{e(str(entry.get("code", ""))[:600])}</pre>',
        e(result.get("status", "")) + (f": {e(error.get('name', ''))}" if error else ""),
        e(f"{float(result.get('duration_ms') or 0):.0f} ms"),
        e(f"{out_chars} chars, {len(result.get('results') or [])} result(s)"),
    ]


async def session_page(parts: UiParts, who: Principal, sid: str, files_page: int, calls_page: int) -> str:
    row = await parts.session(who.owner, sid)
    limit = parts.settings.workspace_mb << 20
    files, nfiles = await parts.files(who.owner, sid, FILES_PER_PAGE, files_page * FILES_PER_PAGE)
    calls = await parts.calls(who.owner, sid)
    body = (
        f"<p>state <b>{e(row.get('state'))}</b> · last used {e(ago(row.get('last_used')))}"
        f" · variables saved {e(when(row.get('variables_saved_at')))}"
        f" · packages kept {e(size(row.get('packages_bytes')))}"
        f" · {link(f'/ui/sessions/{sid}/notebook.ipynb', 'download notebook', id='notebook', download=f'{sid}.ipynb')}</p>"
    )
    variables = await parts.variables(who.owner, sid)
    body += f"<h2>Variables (as saved {e(when(row.get('variables_saved_at')))})</h2>"
    body += (
        table(
            ["name", "type", "size (saved)", "saved with"],
            ([e(v.name), e(v.type), e(size(v.bytes)), e(v.serializer)] for v in variables),
            id="variables",
        )
        if variables
        else '<p class="muted" id="variables">No saved variables yet (they are saved when the session has '
        "been idle a while, and when its interpreter stops).</p>"
    )
    packages = await parts.packages(who.owner, sid)
    body += f"<h2>Packages installed ({e(size(row.get('packages_bytes')))} kept)</h2>"
    body += (
        '<p id="packages">' + ", ".join(f'<span class="tag">{e(p)}</span>' for p in packages) + "</p>"
        if packages
        else '<p class="muted" id="packages">None installed with install_packages.</p>'
    )
    body += f"<h2>Files</h2><p>{quota_bar(int(row.get('workspace_bytes') or 0), limit)} (--workspace-mb)</p>"
    if await parts.files_unmounted(who.owner, sid):
        body += (
            '<p class="muted" id="files-unmounted">Its files are on a file system of their own '
            "(--workspace-fs image), mounted while the session is loaded: run code in it to list them here.</p>"
        )
    body += table(["path", "size"], ([e(p), e(size(n))] for p, n in files), id="files")
    body += pager(
        f"/ui/sessions/{sid}", files_page, (files_page + 1) * FILES_PER_PAGE < nfiles, nfiles, FILES_PER_PAGE
    )
    total = len(calls)
    newest_first = list(reversed(calls))[calls_page * CALLS_PER_PAGE : (calls_page + 1) * CALLS_PER_PAGE]
    body += "<h2>Calls (newest first) and what each cost</h2>"
    body += table(["#", "code", "status", "time", "output"], (call_cost(c) for c in newest_first), id="calls")
    body += (
        pager(
            f"/ui/sessions/{sid}",
            calls_page,
            (calls_page + 1) * CALLS_PER_PAGE < total,
            total,
            CALLS_PER_PAGE,
            files=files_page,
        )
        .replace("?page=", "?calls=")
        .replace("&page=", "&calls=")
    )
    every = await anyio.to_thread.run_sync(parts.jobs, who.owner)  # (reads the jobs' records)
    jobs = [j for j in every if j.get("session_id") == sid][:20]
    if jobs:
        body += "<h2>Jobs</h2>" + jobs_table(jobs)
    return body


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    return table(
        ["job", "session", "state", "started", "code"],
        (
            [
                link(f"/ui/jobs/{j['id']}", j["id"]),
                link(f"/ui/sessions/{j['session_id']}", j["session_id"])
                if j.get("session_id")
                else "(stateless)",
                e(j.get("state")),
                e(when(j.get("started"))),
                f'<span class="text">{e(str(j.get("code", ""))[:160])}</span>',
            ]
            for j in jobs
        ),
        id="jobs",
    )


def jobs_page(parts: UiParts, who: Principal) -> str:
    jobs = parts.jobs(who.owner)[:JOBS_SHOWN]
    return (
        jobs_table(jobs)
        if jobs
        else '<p class="muted">No background jobs (run_code with background=true).</p>'
    )


async def job_page(parts: UiParts, who: Principal, job_id: str) -> tuple[str, bool]:
    record, output = await parts.job(who.owner, job_id)
    running = record.get("state") == "running"
    result = record.get("result") or {}
    took = f" · {float(result.get('duration_ms') or 0):.0f} ms" if result else ""
    poll = f' data-poll="/ui/jobs/{e(job_id)}/output"' if running else ""
    body = (
        f'<p>state <b id="job-state">{e(record.get("state"))}</b> · started {e(when(record.get("started")))}'
        f" · finished {e(when(record.get('finished')))}{e(took)}</p>"
    )
    if record.get("note"):
        body += f'<p class="muted">{e(record["note"])}</p>'
    body += f'<h2>Code</h2><pre class="text">{e(record.get("code", ""))}</pre><h2>Output</h2>'
    body += f'<pre class="out" id="job-output"{poll}>{e(output)}</pre>'
    if result.get("error"):
        body += f'<pre class="text">{e(json.dumps(result["error"], indent=1)[:4000])}</pre>'
    return body, running

"""The ``/ui`` app: routes, who is asking (auth.py), and the answers of every page (docs/ui.md).

Design: one Starlette app under ``/ui`` (in front of the MCP app, or alone under ``kernmind ui``);
every read is keyed by the caller's owner. Error policy: ``NotFound`` → 404; a ``Refusal`` → the
page with its sentence (409 writes, 400 reads); anything else reaches the transport's last resort.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Scope

from kernmind.principals import LOCAL, Principal
from kernmind.refusals import Refusal
from kernmind.ui import memory_views, principals_view, session_views
from kernmind.ui.auth import COOKIE, SESSION_SECONDS, UiAuth, UiSession
from kernmind.ui.data import NotFound, UiParts
from kernmind.ui.pages import e, flash, layout

log = logging.getLogger(__name__)

PREFIX = "/ui"
STATIC = Path(__file__).with_name("static")
STATIC_TYPES = {"ui.css": "text/css; charset=utf-8", "job.js": "text/javascript; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Caller:
    """Who asks, and the CSRF token their forms carry ("" for bearer callers: they need none)."""

    principal: Principal
    session: UiSession | None

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session is not None else ""


def html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status, headers={**HEADERS, **(headers or {})})


class UiApp:
    """The routes of ``/ui`` over ``parts`` (set later by ``kernmind ui``'s lifespan)."""

    def __init__(self, auth: UiAuth, parts: UiParts | None = None) -> None:
        self.auth = auth
        self.parts = parts

    # --- who is asking ---------------------------------------------------------------------------
    def caller(self, request: Request) -> Caller | None:
        principal = self.auth.bearer(request.headers.get("authorization"))
        if principal is not None:
            return Caller(principal, None)
        session = self.auth.session(request.cookies.get(COOKIE))
        return Caller(session.principal, session) if session is not None else None

    def page(
        self, handler: Callable[[Request, Caller], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if (wrong := self._wrong_host(request)) is not None:
                return wrong
            who = self.caller(request)
            if who is None:
                if request.method == "GET":
                    return RedirectResponse(f"{PREFIX}/login", 303, headers=HEADERS)
                return html(layout("Log in first", "<p>Log in, then send the form again.</p>"), 401)
            if request.method == "POST" and who.session is not None:
                form = await request.form()
                if not UiAuth.csrf_ok(who.session, str(form.get("csrf") or "")):
                    return html(
                        layout(
                            "Refused",
                            "<p>This form was not sent from a page of this server (its CSRF token is missing "
                            "or stale). Nothing was changed: reload the page and send it again.</p>",
                            who.principal,
                        ),
                        403,
                    )
            if self.parts is None:
                return html(layout("Starting", "<p>The server is starting; reload in a moment.</p>"), 503)
            try:
                return await handler(request, who)
            except NotFound:
                return html(
                    layout("Not found", "<p>Nothing of yours has that name or id.</p>", who.principal), 404
                )

        return endpoint

    def _wrong_host(self, request: Request) -> Response | None:
        if self.auth.host_ok(request.headers.get("host")):
            return None
        return PlainTextResponse("this page answers on its loopback address only", 421, headers=HEADERS)

    # --- logging in ------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if (wrong := self._wrong_host(request)) is not None:
            return wrong
        principal: Principal | None = None
        message = ""
        if request.method == "GET" and "once" in request.query_params:
            if self.auth.use_code(request.query_params["once"]):
                principal = LOCAL
            else:
                message = "That login link was used already or has expired: ask for a new one (kernmind ui)."
        elif request.method == "POST":
            form = await request.form()
            if self.auth.open:
                principal = self.auth.open_as
            else:
                principal = self.auth.check_token(str(form.get("token") or ""))
                message = "" if principal is not None else "That token is not valid here (wrong or revoked)."
        if principal is not None:
            sid = self.auth.start(principal)
            response = RedirectResponse(f"{PREFIX}/", 303, headers=HEADERS)
            response.set_cookie(
                COOKIE,
                sid,
                max_age=SESSION_SECONDS,
                path=PREFIX,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
        if self.auth.open:
            form = '<form method="post" action="/ui/login"><button id="login">Log in as the local user</button></form>'
        elif self.auth.auth is not None:
            form = (
                '<form method="post" action="/ui/login"><label>Token <input type="password" name="token" '
                'id="token" size="50" autocomplete="off" autofocus></label> <button id="login">Log in</button></form>'
                '<p class="muted">The same bearer token your MCP client uses; it is checked once and not kept.</p>'
            )
        else:
            form = "<p>Open the one-time link <code>kernmind ui</code> printed in its terminal.</p>"
        return html(layout("Log in", flash(message) + form), 401 if message else 200)

    async def logout(self, request: Request) -> Response:
        self.auth.end(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", 303, headers=HEADERS)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_TYPES:
            return PlainTextResponse("not found", 404)
        return Response(
            (STATIC / name).read_bytes(),
            media_type=STATIC_TYPES[name],
            headers={"Cache-Control": "max-age=300"},
        )

    # --- pages -----------------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        p = self.page
        return [
            Route(f"{PREFIX}", lambda r: RedirectResponse(f"{PREFIX}/", 307)),
            Route(f"{PREFIX}/", p(self.home)),
            Route(f"{PREFIX}/login", self.login, methods=["GET", "POST"]),
            Route(f"{PREFIX}/logout", self.logout),
            Route(f"{PREFIX}/static/{{name}}", self.static),
            Route(f"{PREFIX}/memory/blocks", p(self.blocks)),
            Route(f"{PREFIX}/memory/blocks/{{label}}", p(self.block)),
            Route(f"{PREFIX}/memory/blocks/{{label}}/undo", p(self.undo), methods=["POST"]),
            Route(f"{PREFIX}/memory/passages", p(self.passages)),
            Route(f"{PREFIX}/memory/passages/{{pid:int}}", p(self.passage)),
            Route(f"{PREFIX}/memory/passages/{{pid:int}}/delete", p(self.delete), methods=["POST"]),
            Route(f"{PREFIX}/memory/passages/{{pid:int}}/supersede", p(self.supersede), methods=["POST"]),
            Route(f"{PREFIX}/memory/search", p(self.search)),
            Route(f"{PREFIX}/sessions", p(self.sessions)),
            Route(f"{PREFIX}/sessions/{{sid}}", p(self.session)),
            Route(f"{PREFIX}/sessions/{{sid}}/notebook.ipynb", p(self.notebook)),
            Route(f"{PREFIX}/jobs", p(self.jobs)),
            Route(f"{PREFIX}/jobs/{{job_id}}", p(self.job)),
            Route(f"{PREFIX}/jobs/{{job_id}}/output", p(self.job_output)),
            Route(f"{PREFIX}/principals", p(self.principals)),
        ]

    @property
    def data(self) -> UiParts:
        assert self.parts is not None
        return self.parts

    async def home(self, request: Request, who: Caller) -> Response:
        return RedirectResponse(f"{PREFIX}/memory/blocks", 303, headers=HEADERS)

    async def shown(
        self, title: str, who: Caller, make: Callable[[], Awaitable[str]], *, refused_status: int = 400
    ) -> Response:
        try:
            body = await make()
        except Refusal as exc:
            return html(layout(title, flash(str(exc)), who.principal), refused_status)
        return html(layout(title, body, who.principal))

    async def blocks(self, request: Request, who: Caller) -> Response:
        page = _int(request.query_params.get("page"))
        return await self.shown(
            "Memory blocks", who, lambda: memory_views.blocks_page(self.data, who.principal, page)
        )

    async def block(self, request: Request, who: Caller, message: str = "", status: int = 200) -> Response:
        label = request.path_params["label"]
        q = request.query_params
        response = await self.shown(
            f"Block {label}",
            who,
            lambda: memory_views.block_page(
                self.data,
                who.principal,
                who.csrf,
                label,
                _int(q.get("a"), None),
                _int(q.get("b"), None),
                message,
            ),
        )
        if status != 200 and response.status_code == 200:
            response.status_code = status
        return response

    async def undo(self, request: Request, who: Caller) -> Response:
        label = request.path_params["label"]
        form = await request.form()
        expected = _int(str(form.get("expected_version") or ""), None)
        try:
            message, status = await memory_views.undo(self.data, who.principal, label, expected), 200
        except Refusal as exc:
            message, status = str(exc), 409
        if status == 200 and message.startswith("Undid the creation"):
            return html(
                layout(
                    "Blocks",
                    flash(message, ok=True) + '<p><a href="/ui/memory/blocks">all blocks</a></p>',
                    who.principal,
                )
            )
        try:
            return await self.block(request, who, message, status)
        except NotFound:
            return html(layout("Blocks", flash(message), who.principal), status)

    def _filters(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        return {k: q.get(k, "")[:400] for k in ("q", "start", "end", "thread", "superseded") if q.get(k)}

    async def passages(self, request: Request, who: Caller) -> Response:
        return await self._passage_list("Passages timeline", memory_views.timeline_page, request, who)

    async def search(self, request: Request, who: Caller) -> Response:
        return await self._passage_list("Search memory", memory_views.search_page, request, who)

    async def _passage_list(self, title: str, view: Any, request: Request, who: Caller) -> Response:
        page = _int(request.query_params.get("page"))
        return await self.shown(
            title, who, lambda: view(self.data, who.principal, self._filters(request), page)
        )

    async def passage(self, request: Request, who: Caller, message: str = "", status: int = 200) -> Response:
        pid = request.path_params["pid"]
        body = await memory_views.passage_page(self.data, who.principal, who.csrf, pid, message)
        return html(layout(f"Passage #{pid}", body, who.principal), status)

    async def delete(self, request: Request, who: Caller) -> Response:
        pid = request.path_params["pid"]
        try:
            message = await memory_views.delete_passage(self.data, who.principal, pid)
        except Refusal as exc:
            if getattr(exc, "missing", False):
                raise NotFound(str(pid)) from None
            return await self.passage(request, who, str(exc), 409)
        body = flash(message, ok=True) + '<p><a href="/ui/memory/passages">back to the timeline</a></p>'
        return html(layout("Deleted", body, who.principal))

    async def supersede(self, request: Request, who: Caller) -> Response:
        pid = request.path_params["pid"]
        form = await request.form()
        try:
            new_id, message = await memory_views.supersede_passage(
                self.data, who.principal, pid, str(form.get("content") or "")
            )
        except Refusal as exc:
            return await self.passage(request, who, str(exc), 409)
        request.path_params["pid"] = new_id
        return await self.passage(request, who, message)

    async def sessions(self, request: Request, who: Caller) -> Response:
        return await self.shown(
            "Sessions", who, lambda: session_views.sessions_page(self.data, who.principal)
        )

    async def session(self, request: Request, who: Caller) -> Response:
        sid = request.path_params["sid"]
        q = request.query_params
        return await self.shown(
            f"Session {sid}",
            who,
            lambda: session_views.session_page(
                self.data, who.principal, sid, _int(q.get("page")), _int(q.get("calls"))
            ),
        )

    async def notebook(self, request: Request, who: Caller) -> Response:
        sid = request.path_params["sid"]
        data = await self.data.notebook(who.principal.owner, sid)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in sid) or "session"
        return Response(
            data,
            media_type="application/x-ipynb+json",
            headers={**HEADERS, "Content-Disposition": f'attachment; filename="{name}.ipynb"'},
        )

    async def jobs(self, request: Request, who: Caller) -> Response:
        body = await anyio.to_thread.run_sync(
            session_views.jobs_page, self.data, who.principal
        )  # reads records
        return html(layout("Background jobs", body, who.principal))

    async def job(self, request: Request, who: Caller) -> Response:
        job_id = request.path_params["job_id"]
        body, running = await session_views.job_page(self.data, who.principal, job_id)
        head = '<noscript><meta http-equiv="refresh" content="2"></noscript>' if running else ""
        return html(layout(f"Job {job_id}", body, who.principal, head=head, script=running))

    async def job_output(self, request: Request, who: Caller) -> Response:
        record, output = await self.data.job(who.principal.owner, request.path_params["job_id"])
        return PlainTextResponse(output, headers={**HEADERS, "X-Job-State": str(record.get("state"))})

    async def principals(self, request: Request, who: Caller) -> Response:
        if not who.principal.admin:
            raise NotFound("principals")
        return html(
            layout(
                "Principals", await principals_view.principals_page(self.data, who.principal), who.principal
            )
        )

    # --- the app ---------------------------------------------------------------------------------
    def starlette(
        self, lifespan: Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None = None
    ) -> Starlette:
        return Starlette(routes=self.routes(), lifespan=lifespan)


def _int(text: str | None, default: Any = 0) -> Any:
    try:
        value = int(str(text))
    except (TypeError, ValueError):
        return default
    return value if 0 <= value < 10**9 else default


class UiMount:
    """``/ui`` to the page app, everything else to ``app`` (ASGI)."""

    def __init__(self, app: ASGIApp, ui: ASGIApp) -> None:
        self.app, self.ui = app, ui

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == PREFIX or path.startswith(PREFIX + "/"):
            await self.ui(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def mount_ui(app: ASGIApp, server: Any, settings: Any, authenticator: Any, loopback: bool) -> ASGIApp:
    """The HTTP transport's app with ``/ui`` in front (the server's memory and executor:
    ``server.kernmind_parts``, set by server.py). Without a token the UI is open on loopback
    only, as ``/mcp`` is."""
    found = getattr(server, "kernmind_parts", None)
    if found is None:
        return app
    executor, memory = found
    auth = UiAuth(
        authenticator if authenticator.required else None,
        open_as=None if authenticator.required else LOCAL,
        loopback_only=loopback,
    )
    ui = UiApp(auth, UiParts(settings, memory, executor))
    return UiMount(app, ui.starlette())


__all__ = ["PREFIX", "UiApp", "UiMount", "e", "mount_ui"]

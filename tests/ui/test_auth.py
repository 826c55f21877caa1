"""The /ui logins in process (ui/auth.py): one-time codes, sessions, CSRF tokens, host names."""

from __future__ import annotations

import time

import pytest

from kernmind.principals import LOCAL
from kernmind.tokens_file import Authenticator
from kernmind.ui.auth import UiAuth

pytestmark = pytest.mark.fast


def test_a_one_time_code_works_once_and_expires() -> None:
    auth = UiAuth(None)
    code = auth.one_time_code()
    assert not auth.use_code("guess")
    assert auth.use_code(code) and not auth.use_code(code)
    late = auth.one_time_code()
    auth.one_time[late] = time.time() - 1
    assert not auth.use_code(late)


def test_sessions_csrf_and_bearer() -> None:
    auth = UiAuth(Authenticator(token="s3cret-token"))
    assert auth.check_token("wrong") is None and auth.bearer("Bearer wrong") is None
    who = auth.check_token("s3cret-token")
    assert who is not None and who.admin
    assert auth.bearer("Bearer s3cret-token") == who and auth.bearer("Basic s3cret-token") is None
    sid = auth.start(who)
    session = auth.session(sid)
    assert session is not None and session.principal == who
    assert UiAuth.csrf_ok(session, session.csrf)
    assert not UiAuth.csrf_ok(session, "") and not UiAuth.csrf_ok(session, session.csrf[:-1] + "x")
    other = auth.session(auth.start(LOCAL))
    assert other is not None and not UiAuth.csrf_ok(session, other.csrf)  # another session's token
    session.expires = time.time() - 1
    assert auth.session(sid) is None and sid not in auth.sessions
    auth.end(None)


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8000", True),
        ("localhost:1", True),
        ("[::1]:8000", True),
        ("app.localhost", True),
        ("evil.example", False),
        ("127.0.0.1.evil.example:80", False),
        ("", False),
    ],
)
def test_only_loopback_host_names_on_a_loopback_server(host: str, ok: bool) -> None:
    assert UiAuth(None).host_ok(host) is ok
    assert UiAuth(None, loopback_only=False).host_ok(host)

"""The revocation watch: a revoked principal's running code is ended without waiting for a request.

Design: ``watch_revocations`` keeps the server's tokens file in force (``principals.in_force``,
which ``principals.revoked`` consults) and looks at it every ``REVOCATION_PERIOD``; for each
data key a live entry held and none holds now (revoked, or the file emptied or removed) it
calls ``on_revoked(key, sentence)``, which ends what runs under that key
(``Executor.end_principal``: calls, kernels, jobs, processes, each result saying why). A
disappearance is looked at once more ``REVOCATION_SETTLE`` later before anything is ended,
so an editor that truncates the file before writing it does not end everyone's kernels.
A key that comes back (``kernmind tokens add NAME --adopt``) is live again at once: nothing
here remembers a revocation, the file is the only record.

Error policy: the watch never raises (it is supervised by construction): what fails in a
turn, reading the file or ending a principal's code, is logged with its traceback, and the
next turn looks again; a principal whose code could not be ended is still refused by every
check (``principals.revoked``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from kernmind.principals import TokenFile, TokenFileError, in_force, principal_keeping, revoked_sentence

log = logging.getLogger(__name__)

REVOCATION_PERIOD = 0.5  # seconds between the watch's looks at the tokens file
REVOCATION_SETTLE = 0.2  # seconds before a disappearance is acted on (looked at once more)


OnRevoked = Callable[[str, str], Awaitable[None]]


async def watch_revocations(path: Path, on_revoked: OnRevoked, *, period: float = REVOCATION_PERIOD) -> None:
    """Keep the tokens file at ``path`` in force and call ``on_revoked(key, sentence)`` for each data
    key that a live entry held and none holds now (revoked, or the file emptied or removed): the
    server ends what runs under it without waiting for a request. A disappearance is looked at
    once more ``REVOCATION_SETTLE`` later before anything is ended (an editor that truncates the
    file before writing it does not end everyone's kernels). Runs until cancelled; never raises
    anything else (each turn's failure is logged, and the next turn looks again)."""
    tokens = TokenFile(path)
    with in_force(tokens):
        seen: set[str] = set()
        with contextlib.suppress(TokenFileError):  # unreadable now: the next turns read it
            tokens.refresh(strict=True)
            seen = tokens.live_owners()
        while True:
            await anyio.sleep(period)
            try:
                seen = await _revocation_turn(tokens, seen, on_revoked)
            except Exception:
                log.exception("the revocation watch of %s failed a turn; it looks again", path)


async def _revocation_turn(tokens: TokenFile, seen: set[str], on_revoked: OnRevoked) -> set[str]:
    tokens.refresh()
    gone = seen - tokens.live_owners()
    if gone:
        await anyio.sleep(REVOCATION_SETTLE)
        tokens.refresh()
        gone -= tokens.live_owners()
    tokens.ended = (tokens.ended | gone) - tokens.live_owners()  # (principals.revoked reads it)
    for owner in sorted(gone):
        name = tokens.revoked_name(owner) or principal_keeping(owner).name
        log.warning("principal %r (data key %r) was revoked: ending what runs for it", name, owner)
        try:
            await on_revoked(owner, revoked_sentence(name))
        except Exception:
            log.exception(
                "ending what runs for the revoked %r failed; its calls are refused all the same", owner
            )
    return tokens.live_owners()

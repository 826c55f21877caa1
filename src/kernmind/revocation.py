"""Revocation: what running code checks, and the watch that ends a revoked principal's code
(docs/security.md).

Design: ``revoked(principal or key)`` gives the refusal's sentence or None; ``watch_revocations``
polls the tokens file and looks again ``REVOCATION_SETTLE`` later, so an editor truncating the
file ends nobody's kernels. Error policy: the watch never raises; a failed turn is logged, and a
principal whose code could not be ended is still refused by every check.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio

from kernmind.principals import LOCAL, SHARED_TOKEN, Principal, principal_keeping
from kernmind.tokens_file import TokenFile, TokenFileError

log = logging.getLogger(__name__)

REVOCATION_PERIOD = 0.5  # seconds between the watch's looks at the tokens file
REVOCATION_SETTLE = 0.2  # seconds before a disappearance is acted on (looked at once more)


REVOKED_ERROR = "PrincipalRevoked"  # the error name of a result stopped by a revocation

_IN_FORCE: list[TokenFile] = []  # the tokens files of the servers running in this process


@contextlib.contextmanager
def in_force(tokens: TokenFile) -> Iterator[TokenFile]:
    """While in this block, ``revoked()`` consults ``tokens`` (a server's tokens file)."""
    _IN_FORCE.append(tokens)
    try:
        yield tokens
    finally:
        _IN_FORCE.remove(tokens)


def revoked(who: Principal | str) -> str | None:
    """The sentence to refuse ``who`` (a principal or a data key) with, or None while it may act
    (always for the local user, the ``--token`` principal and keys no file in force ever named).
    Each call looks at the file (a ``stat``): a revocation counts from the next check on."""
    owner = who.owner if isinstance(who, Principal) else who
    if owner in (LOCAL.owner, SHARED_TOKEN.owner) or not _IN_FORCE:
        return None
    files = list(_IN_FORCE)
    for tokens in files:
        with contextlib.suppress(TokenFileError):  # never read yet (not once in force): the last look
            tokens.refresh()
        if owner in tokens.live_owners():
            return None
    for tokens in files:
        name = tokens.revoked_name(owner)
        if name is not None or owner in tokens.ended:
            return revoked_sentence(name or principal_keeping(owner).name)
    return None


def still_valid(principal: Principal) -> bool:
    """The principal may still act (its token, or the entry behind it, is live)."""
    return revoked(principal) is None


def revoked_sentence(name: str) -> str:
    return (
        f"stopped: the principal {name!r} was revoked, so its code no longer runs and its calls are "
        "refused; its files and saved variables are kept."
    )


OnRevoked = Callable[[str, str], Awaitable[None]]


async def watch_revocations(path: Path, on_revoked: OnRevoked, *, period: float = REVOCATION_PERIOD) -> None:
    """Keep the tokens file at ``path`` in force and call ``on_revoked`` for each key no live
    entry holds any more (see the module docstring); runs until cancelled."""
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
    tokens.ended = (tokens.ended | gone) - tokens.live_owners()  # (``revoked`` reads it)
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

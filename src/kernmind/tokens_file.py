"""The tokens file: principals by token digest, re-read when it changes, and bearer tokens.

Design: JSON, 0600, only each token's SHA-256 digest (tokens are 256-bit random); re-read when its
mtime, size or inode changes (docs/security.md). Error policy: a malformed file is a
``TokenFileError`` at start; after start an unreadable file keeps the last good contents and logs
why, so a half-written edit locks no one out or in.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernmind.diskio import read_file
from kernmind.principals import LOCAL, NAME_RE, OWNER_RE, SHARED_TOKEN, Principal

log = logging.getLogger(__name__)


class TokenFileError(ValueError):
    """The tokens file cannot be used (its path and the problem are in the message)."""


def owner_of(entry: dict[str, Any]) -> str:
    """The data key of a tokens-file entry (live or revoked)."""
    return str(entry.get("owner") or entry["name"])


def now_text() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def digest(token: str | bytes) -> str:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise TokenFileError(
            f"invalid principal name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with "
            "a letter or digit."
        )
    if name in (LOCAL.name, SHARED_TOKEN.name):
        raise TokenFileError(f"{name!r} is reserved (the stdio user, or the single --token principal).")
    return name


@dataclass
class TokenFile:
    """A tokens file: principals by token digest, re-read when the file changes."""

    path: Path
    _stamp: tuple[int, int, int] | None = field(default=None, repr=False)
    _read: bool = field(default=False, repr=False)  # read once (a missing file counts): keep it from then on
    _bad: tuple[int, int, int] | None = field(default=None, repr=False)  # the unusable version logged last
    _by_digest: dict[str, Principal] = field(default_factory=dict, repr=False)
    _entries: list[dict[str, Any]] = field(default_factory=list, repr=False)
    _revoked: list[dict[str, Any]] = field(default_factory=list, repr=False)
    # Keys a live entry held while a server watched this file and none holds now (revocation.py).
    ended: set[str] = field(default_factory=set, repr=False)

    # --- reading ---------------------------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        self.refresh(strict=True)
        return [dict(e) for e in self._entries]

    def revoked(self) -> list[dict[str, Any]]:
        """Revoked principals, oldest first: name, owner (their data's key), roles, created, revoked."""
        self.refresh(strict=True)
        return [dict(e) for e in self._revoked]

    def refresh(self, *, strict: bool = False) -> None:
        """Re-read the file if it changed; a missing file means no principals."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._entries, self._revoked, self._by_digest = None, [], [], {}
            self._read = True
            return
        except OSError as exc:  # (a directory above it lost its permissions): as unreadable
            self._unusable(exc, strict)
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp or (stamp == self._bad and not strict):
            return
        try:
            # never waits (a FIFO planted here hung the event loop), never more than 64 MiB
            entries, revoked = _parse(read_file(self.path, 1 << 26, follow_links=True), self.path)
        except (OSError, TokenFileError) as exc:
            self._bad = stamp  # (read again, and logged again, once it changes)
            self._unusable(exc, strict)
            return
        self._entries, self._revoked = entries, revoked
        self._by_digest = {
            e["sha256"]: Principal(e["name"], tuple(e.get("roles", ())), owner_of(e)) for e in entries
        }
        self._stamp, self._read = stamp, True

    def _unusable(self, exc: Exception, strict: bool) -> None:
        """Raise at start (or when asked to); after that, keep the last good contents (a request's
        check must never fail: a 500 for everyone would follow)."""
        if strict or not self._read:
            raise TokenFileError(str(exc)) from exc
        log.error("tokens file %s is unusable, keeping the previous contents: %s", self.path, exc)

    def live_owners(self) -> set[str]:
        """The data keys of the live principals, as the file was at the last ``refresh``."""
        return {owner_of(e) for e in self._entries}

    def revoked_name(self, owner: str) -> str | None:
        """The name of the latest revoked principal whose data key is ``owner`` (last ``refresh``)."""
        for record in reversed(self._revoked):
            if owner_of(record) == owner:
                return str(record["name"])
        return None

    def principal_for(self, token: str | bytes) -> Principal | None:
        self.refresh()
        wanted = digest(token)
        found = None
        for known, principal in self._by_digest.items():  # compare every entry: no early exit
            if hmac.compare_digest(known, wanted):
                found = principal
        return found

    # --- writing (kernmind tokens) ----------------------------------------------------------
    def add(
        self,
        name: str,
        roles: list[str],
        *,
        adopt: str | None = None,
        data_under: Callable[[str], bool] | None = None,
    ) -> str:
        """Make a token for a new principal ``name``; returns the token (shown once).

        Its data key is fresh (the name, or ``name~N`` when that key was used before), unless
        ``adopt`` names a revoked principal (its name, or its key) whose data it takes over.
        ``data_under(key)`` says whether data is stored under a key; a key with data that no
        entry records is recorded as revoked (data from before revocations were recorded)."""
        check_name(name)
        exists = self.path.exists()
        entries = self.entries() if exists else []
        revoked = self.revoked() if exists else []
        if any(e["name"] == name for e in entries):
            raise TokenFileError(
                f"a principal named {name!r} exists already; revoke it first to replace its token."
            )
        if adopt is not None:
            record = _revoked_record(revoked, adopt, self.path)
            revoked.remove(record)
            key = owner_of(record)
        else:
            key = self._fresh_key(name, entries, revoked, data_under)
        token = "km_" + secrets.token_urlsafe(32)
        entry = {"name": name, "sha256": digest(token), "roles": sorted(set(roles)), "created": now_text()}
        if key != name:
            entry["owner"] = key
        entries.append(entry)
        self._write(entries, revoked)
        return token

    @staticmethod
    def _fresh_key(
        name: str,
        entries: list[dict[str, Any]],
        revoked: list[dict[str, Any]],
        data_under: Callable[[str], bool] | None,
    ) -> str:
        used = {owner_of(e) for e in entries} | {owner_of(e) for e in revoked}
        generation = 1
        while True:
            key = name if generation == 1 else f"{name}~{generation}"
            if key not in used:
                if data_under is None or not data_under(key):
                    return key
                # Data that no entry records: a principal revoked before revocations were recorded.
                revoked.append({"name": name, "owner": key, "roles": [], "created": None, "revoked": None})
            generation += 1

    def revoke(self, name: str) -> dict[str, Any]:
        """Revoke ``name``: its token stops working; its data stays, under its key (returned record)."""
        entries = self.entries()
        gone = [e for e in entries if e["name"] == name]
        if not gone:
            known = ", ".join(e["name"] for e in entries) or "none"
            raise TokenFileError(f"no principal named {name!r} in {self.path}; principals: {known}.")
        entry = gone[0]
        record = {
            "name": name,
            "owner": owner_of(entry),
            "roles": entry.get("roles", []),
            "created": entry.get("created"),
            "revoked": now_text(),
        }
        self._write([e for e in entries if e is not entry], [*self.revoked(), record])
        return record

    def _write(self, entries: list[dict[str, Any]], revoked: list[dict[str, Any]]) -> None:
        """Atomically replace the file (0600), so readers never see half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=self.path.parent)
        doc: dict[str, Any] = {"tokens": entries}
        if revoked:
            doc["revoked"] = revoked
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, indent=2)
                fh.write("\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._stamp = None


def _revoked_record(revoked: list[dict[str, Any]], wanted: str, path: Path) -> dict[str, Any]:
    """The revoked principal ``wanted`` names: the latest revoked of that name, else by data key."""
    for record in reversed(revoked):
        if record["name"] == wanted:
            return record
    for record in revoked:
        if owner_of(record) == wanted:
            return record
    known = ", ".join(sorted({f"{r['name']} ({owner_of(r)})" for r in revoked})) or "none"
    raise TokenFileError(
        f"nothing to adopt: no revoked principal {wanted!r} in {path}; revoked principals (with their "
        f"data keys): {known}. `kernmind tokens list` shows them."
    )


def _parse(raw: bytes, path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    try:
        doc = json.loads(raw or b'{"tokens": []}')
    except (ValueError, RecursionError) as exc:  # (nested too deeply: RecursionError)
        raise TokenFileError(f"{path} is not valid JSON: {exc}") from exc
    entries = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise TokenFileError(f'{path} must hold {{"tokens": [...]}}')
    revoked = doc.get("revoked", [])
    if not isinstance(revoked, list) or not all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and OWNER_RE.match(owner_of(r))
        for r in revoked
    ):
        raise TokenFileError(f'{path}: "revoked" must be a list of {{"name": …, "owner": …}} records')
    seen: set[str] = set()
    keys: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise TokenFileError(f"{path}: entry {i} needs a name")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise TokenFileError(f"{path}: entry {entry['name']!r} needs a sha256 (64 hex digits)")
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise TokenFileError(f"{path}: entry {entry['name']!r} has roles that are not a list of names")
        if entry["name"] in seen:
            raise TokenFileError(f"{path}: principal {entry['name']!r} appears twice")
        key = entry.get("owner", entry["name"])
        if not isinstance(key, str) or not OWNER_RE.match(key) or key in keys:
            raise TokenFileError(
                f"{path}: entry {entry['name']!r} has an owner key that is malformed or not its own"
            )
        seen.add(entry["name"])
        keys.add(key)
    return entries, revoked


@dataclass
class Authenticator:
    """Bearer token → principal, from ``--token`` and/or a tokens file."""

    token: str | None = None
    tokens: TokenFile | None = None

    @classmethod
    def of(cls, token: str | None, tokens_file: Path | None, data_dir: Path) -> Authenticator:
        """``--token`` and the tokens file in use, read now (``TokenFileError`` for a malformed file
        stops the start). With a token and no tokens file yet, the file ``kernmind tokens add``
        would make is watched: a principal added while the server runs works at once."""
        path = tokens_file_in_use(tokens_file, data_dir)
        if path is None and token:
            path = default_tokens_file(data_dir)
        tokens = None
        if path is not None:
            tokens = TokenFile(path)
            tokens.refresh(strict=True)
        return cls(token=token or None, tokens=tokens)

    @property
    def required(self) -> bool:
        return bool(self.token) or self.tokens is not None

    def principal_for(self, credential: bytes) -> Principal | None:
        found = None
        if self.token and hmac.compare_digest(digest(credential), digest(self.token)):
            found = SHARED_TOKEN
        if self.tokens is not None:
            found = self.tokens.principal_for(credential) or found
        return found


def default_tokens_file(data_dir: Path) -> Path:
    return data_dir / "tokens.json"


def tokens_file_in_use(tokens_file: Path | None, data_dir: Path) -> Path | None:
    """``--tokens FILE``, else ``<data dir>/tokens.json`` when ``kernmind tokens add`` made one."""
    if tokens_file is not None:
        return tokens_file
    default = default_tokens_file(data_dir)
    return default if default.exists() else None

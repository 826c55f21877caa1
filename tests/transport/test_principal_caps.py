"""Caps per principal over real HTTP: one principal cannot crowd out the others.

A `kernmind serve --transport http --tokens FILE --max-sessions 4
--max-stored-sessions-per-principal 3` process: with a tokens file each principal's share of
live sessions defaults to half the server's (2). Each test uses principals of its own, so what one test leaves does not count in
another. Background jobs that sleep keep sessions busy (a busy session is never unloaded to
make room); the tests cancel them at the end.

- bob's sessions do not refuse alice's, and bob's refusal names only bob's sessions;
- at the server-wide bound the refusal says so and names nobody else's sessions;
- past a cap, the caller's least recently used idle session is unloaded instead (variables
  come back on its next call); at the server-wide bound, an idle one of whoever holds most;
- stored sessions are capped per principal, naming only the caller's;
- `--stateless` background jobs count against the same cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("principal-caps"), pytest.mark.slow]

NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "gina", "hal")
SLEEP = "import time; time.sleep(120)"


class Deployment:
    def __init__(self, server: HttpServer, tokens: dict[str, str]) -> None:
        self.server = server
        self.tokens = tokens

    @asynccontextmanager
    async def client(self, who: str) -> AsyncIterator[Client]:
        async with http_client(self.server.url, {"Authorization": f"Bearer {self.tokens[who]}"}, "auto") as c:
            yield c


def deploy(tmp: Path, *flags: str) -> Iterator[Deployment]:
    tokens_file = tmp / "tokens.json"
    file = TokenFile(tokens_file)
    tokens = {name: file.add(name, []) for name in NAMES}
    server = start_http(tmp, "--tokens", str(tokens_file), "--sandbox", "none", *flags)
    try:
        yield Deployment(server, tokens)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from deploy(
        tmp_path_factory.mktemp("caps"),
        "--max-sessions",
        "4",
        "--max-stored-sessions",
        "40",
        "--max-stored-sessions-per-principal",
        "3",
    )


@pytest.fixture(scope="module")
def stateless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from deploy(tmp_path_factory.mktemp("caps-stateless"), "--stateless", "--max-sessions", "4")


async def run(client: Client, code: str, session: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"code": code} | ({"session_id": session} if session else {})
    return structured(await client.call_tool("run_code", args))


async def sleeper(client: Client, session: str | None) -> str:
    args: dict[str, Any] = {"code": SLEEP, "background": True} | ({"session_id": session} if session else {})
    return structured(await client.call_tool("run_code", args))["job_id"]


async def cancel(client: Client, jobs: list[str]) -> None:
    for job in jobs:
        structured(await client.call_tool("job_cancel", {"job_id": job}))


async def test_one_principals_sessions_do_not_refuse_anothers(shared: Deployment) -> None:
    async with shared.client("bob") as bob, shared.client("alice") as alice:
        jobs = [await sleeper(bob, f"bob-secret-{i}") for i in range(2)]
        try:
            refused = error_text(
                await bob.call_tool(
                    "run_code", {"code": SLEEP, "session_id": "bob-secret-2", "background": True}
                )
            )
            assert "bob-secret-0, bob-secret-1" in refused and "--max-sessions-per-principal 2" in refused
            assert "job_cancel" in refused and "close_session" in refused
            assert (await run(alice, "1 + 1"))["results"][0]["text"] == "2"  # alice's default
            assert (await run(alice, "2 + 2", "alice-own"))["results"][0]["text"] == "4"
            again = error_text(await bob.call_tool("run_code", {"code": "1", "session_id": "bob-other"}))
            assert "bob-secret-0" in again and "alice" not in again and "default" not in again
        finally:
            await cancel(bob, jobs)
        assert (await run(bob, "3", "bob-secret-2"))["results"][0]["text"] == "3"


async def test_the_server_wide_bound_names_nobody_elses_sessions(shared: Deployment) -> None:
    async with shared.client("carol") as carol, shared.client("dave") as dave, shared.client("erin") as erin:
        holders = [(carol, "carol"), (dave, "dave")]
        jobs = [[await sleeper(c, f"{who}-busy-{i}") for i in range(2)] for c, who in holders]
        try:
            refused = error_text(await erin.call_tool("run_code", {"code": "1", "session_id": "erin-1"}))
            assert "--max-sessions" in refused and "all principals together" in refused, refused
            assert "carol" not in refused and "dave" not in refused and "-busy-" not in refused
        finally:
            for (client, _), ids in zip(holders, jobs, strict=True):
                await cancel(client, ids)
        # now everything is idle: erin's call unloads someone's least recently used idle session
        assert (await run(erin, "5", "erin-1"))["results"][0]["text"] == "5"


async def test_past_the_cap_the_least_recently_used_idle_session_is_unloaded(shared: Deployment) -> None:
    async with shared.client("frank") as frank:
        await run(frank, "kept = 'frank-1'", "f1")
        await run(frank, "kept = 'frank-2'", "f2")
        assert (await run(frank, "3", "f3"))["results"][0]["text"] == "3"  # f1 is unloaded
        states = {
            s["session_id"]: s["state"]
            for s in structured(await frank.call_tool("list_sessions", {}))["sessions"]
        }
        assert states == {"f1": "stored", "f2": "live", "f3": "live"}, states
        back = await run(frank, "kept", "f1")
        assert back["results"][0]["text"] == "'frank-1'"
        assert any("resumed stored session 'f1'" in n for n in back["notes"]), back["notes"]


async def test_stored_sessions_are_capped_per_principal(shared: Deployment) -> None:
    async with shared.client("gina") as gina, shared.client("hal") as hal:
        for sid in ("g1", "g2", "g3"):
            structured(
                await gina.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": sid})
            )
        refused = error_text(
            await gina.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": "g4"})
        )
        assert "you have 3 stored sessions" in refused and "--max-stored-sessions-per-principal 3" in refused
        assert "g1" in refused and "hal" not in refused
        structured(await hal.call_tool("upload_file", {"path": "a.txt", "content": "x", "session_id": "h1"}))


async def test_stateless_background_jobs_count_against_the_cap(stateless: Deployment) -> None:
    async with stateless.client("bob") as bob, stateless.client("alice") as alice:
        jobs = [await sleeper(bob, None) for _ in range(2)]
        try:
            refused = error_text(await bob.call_tool("run_code", {"code": SLEEP, "background": True}))
            assert "2 calls running at once" in refused and "job_cancel" in refused, refused
            assert "calls running" in error_text(await bob.call_tool("run_code", {"code": "1"}))
            assert (await run(alice, "6 * 7"))["results"][0]["text"] == "42"
        finally:
            await cancel(bob, jobs)
        assert (await run(bob, "1"))["results"][0]["text"] == "1"

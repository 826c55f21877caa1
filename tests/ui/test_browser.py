"""The /ui pages in a real headless Chromium against a real ``kernmind serve --transport http``.

One server (tokens for alice, bob and an admin, root) and one browser for the module. alice's
memory and sessions are made through MCP first, as an agent would; then the browser logs in
with her token and checks each view: blocks and a diff of two versions, undo, the passage
timeline with a ``<script>`` passage shown as text, search with score bars, a session and its
notebook downloaded, a background job's output growing. Writes without the CSRF token are
refused; bob's ids answer 404 to alice; a screenshot of each main view is saved under the
test's temp dir and checked not to be blank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from kernmind.tokens_file import TokenFile
from tests.conftest import structured
from tests.transport.procs import HttpServer, http_client, start_http
from tests.ui.browser import need_browser, png_rows, start_browser

pytestmark = [pytest.mark.xdist_group("ui_browser"), pytest.mark.slow]

SCRIPT_TEXT = "<script>document.title='pwned'</script><b>bold?</b> Mira's note"
WAIT = 60


@dataclass
class Site:
    server: HttpServer
    tokens: dict[str, str]
    base: str
    tmp: Path
    ids: dict[str, Any] = field(default_factory=dict)

    def get(self, path: str, who: str = "alice", **kw: Any) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx2.get(self.base + path, headers=headers, timeout=30, follow_redirects=False, **kw)


async def _call(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return structured(await client.call_tool(tool, args))


async def _seed(site: Site) -> None:
    url = site.server.url
    async with http_client(url, {"Authorization": f"Bearer {site.tokens['alice']}"}, "auto") as alice:
        await _call(alice, "memory_create", {"label": "plans", "value": "line one\nline two\n"})
        await _call(alice, "memory_replace", {"label": "plans", "old_str": "line two", "new_str": "line 2"})
        await _call(alice, "memory_append", {"label": "plans", "content": "line three"})
        first = await _call(
            alice, "archival_memory_insert", {"content": "Mira lives in Bergen", "thread": "moves"}
        )
        await _call(
            alice,
            "archival_memory_insert",
            {"content": "Mira moved to Oslo", "thread": "moves", "supersedes": [first["id"]]},
        )
        evil = await _call(alice, "archival_memory_insert", {"content": SCRIPT_TEXT})
        site.ids["evil"] = evil["id"]
        await _call(alice, "run_code", {"code": "x = 41\nprint('hello from s1')", "session_id": "s1"})
        await _call(
            alice, "run_code", {"code": "open('data.txt','w').write('z'*5000); x + 1", "session_id": "s1"}
        )
        job = await _call(
            alice,
            "run_code",
            {
                "code": "import time\nfor i in range(400):\n    print('tick', i, flush=True)\n    time.sleep(0.25)",
                "session_id": "jobs",
                "background": True,
            },
        )
        site.ids["job"] = job["job_id"]
    async with http_client(url, {"Authorization": f"Bearer {site.tokens['bob']}"}, "auto") as bob:
        secret = await _call(bob, "archival_memory_insert", {"content": "bob's secret passage"})
        site.ids["bob_passage"] = secret["id"]
        await _call(bob, "memory_create", {"label": "bobs_block", "value": "bob only"})
        await _call(bob, "run_code", {"code": "print('bob')", "session_id": "bobs"})
        bjob = await _call(
            bob, "run_code", {"code": "print('bob job')", "session_id": "bobjob", "background": True}
        )
        site.ids["bob_job"] = bjob["job_id"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    need_browser()
    tmp = tmp_path_factory.mktemp("ui")
    tokens_file = tmp / "tokens.json"
    file = TokenFile(tokens_file)
    tokens = {n: file.add(n, r) for n, r in (("alice", []), ("bob", []), ("root", ["admin"]))}
    server = start_http(
        tmp,
        "--tokens",
        str(tokens_file),
        "--sandbox",
        "none",
        "--embedding-model",
        "static",
        "--autosave-seconds",
        "1",
    )
    try:
        s = Site(server, tokens, server.url.removesuffix("/mcp"), tmp)
        anyio.run(_seed, s)
        yield s
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    driver = start_browser(site.tmp / "profile", site.tmp / "downloads")
    try:
        driver.get(site.base + "/ui/login")
        driver.find_element("id", "token").send_keys(site.tokens["alice"])
        driver.find_element("id", "login").click()
        wait_for(driver, lambda d: "/ui/memory/blocks" in d.current_url)
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, condition: Any, timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def shot(driver: Any, tmp: Path, name: str) -> None:
    path = tmp / "screens" / f"{name}.png"
    path.parent.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(path))
    width, height, distinct = png_rows(path)
    assert width > 200 and height > 200
    assert distinct > 20, f"the screenshot of {name} looks blank ({distinct} distinct rows)"


def text_of(driver: Any, css: str) -> str:
    return driver.find_element("css selector", css).text


# --- the views ------------------------------------------------------------------------------------
def test_login_sets_an_httponly_strict_cookie_and_pages_link_plainly(site: Site, browser: Any) -> None:
    cookie = browser.get_cookie("kernmind_ui")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "plans" in text_of(browser, "#blocks")
    hrefs = {a.get_attribute("href") for a in browser.find_elements("css selector", "header a")}
    assert {site.base + p for p in ("/ui/memory/passages", "/ui/sessions", "/ui/jobs")} <= hrefs
    assert site.base + "/ui/principals" not in hrefs  # alice is no admin
    shot(browser, site.tmp, "blocks")


def test_a_block_diff_between_two_versions_and_undo(site: Site, browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(site.base + "/ui/memory/blocks/plans")
    assert text_of(browser, "#block-version") == "3"
    Select(browser.find_element("name", "a")).select_by_value("1")
    Select(browser.find_element("name", "b")).select_by_value("3")
    browser.find_element("css selector", "form[method=get] button").click()
    wait_for(browser, lambda d: "a=1" in d.current_url)
    removed = [el.text for el in browser.find_elements("css selector", "#diff .rem")]
    added = [el.text for el in browser.find_elements("css selector", "#diff .add")]
    assert "-line two" in removed and "+line 2" in added and "+line three" in added
    shot(browser, site.tmp, "block_diff")
    browser.find_element("xpath", "//button[text()='Undo the last change']").click()
    wait_for(browser, lambda d: "Undid" in d.find_element("css selector", ".flash").text)
    assert text_of(browser, "#block-version") == "4"
    assert "line three" not in text_of(browser, "#block-value")


def test_the_timeline_shows_stored_script_as_text_and_supersede_chains(site: Site, browser: Any) -> None:
    browser.get(site.base + "/ui/memory/passages?superseded=1")
    table = text_of(browser, "#passages")
    assert SCRIPT_TEXT in table  # the markup is text on the page
    assert browser.title != "pwned"
    assert not browser.find_elements("css selector", "#passages b")
    assert "Mira lives in Bergen" in table and "→ #" in table  # a superseded passage links onward
    shot(browser, site.tmp, "passages")
    browser.get(site.base + "/ui/memory/passages?thread=moves&superseded=1")
    assert "Mira moved to Oslo" in text_of(browser, "#passages")
    assert "Mira's note" not in text_of(browser, "#passages")


def test_search_shows_score_bars_and_match(site: Site, browser: Any) -> None:
    browser.get(site.base + "/ui/memory/search")
    box = browser.find_element("id", "search-box")
    box.send_keys("Where does Mira live?")
    box.submit()
    wait_for(browser, lambda d: d.find_elements("css selector", "#results .score-bar"))
    bars = browser.find_elements("css selector", "#results .score-bar")
    assert any(int(b.get_attribute("style").split("width:")[1].split("px")[0]) > 0 for b in bars)
    assert "Oslo" in text_of(browser, "#results")
    assert re.search(r"\b(words|meaning|both)\b", text_of(browser, "#results"))
    shot(browser, site.tmp, "search")


def test_a_session_its_files_calls_and_notebook_download(site: Site, browser: Any) -> None:
    browser.get(site.base + "/ui/sessions")
    shot(browser, site.tmp, "sessions")
    browser.find_element("link text", "s1").click()
    wait_for(browser, lambda d: d.find_elements("id", "calls"))
    assert "data.txt" in text_of(browser, "#files")
    calls = text_of(browser, "#calls")
    assert (
        "x = 41" in calls and re.search(r"\d+ ms", calls) and "14 chars" in calls
    )  # its output: hello from s1

    # its variables, once saved (idle a second: --autosave-seconds 1), listed without unpickling
    def saved(d: Any) -> bool:
        d.refresh()
        return "int" in d.find_element("id", "variables").text

    wait_for(browser, saved)
    assert re.search(r"\bx int\b", text_of(browser, "#variables"))
    shot(browser, site.tmp, "session")
    browser.find_element("id", "notebook").click()
    target = site.tmp / "downloads" / "s1.ipynb"
    wait_for(browser, lambda d: target.exists() and target.stat().st_size > 0)
    nb = json.loads(target.read_text())
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("x = 41" in s for s in sources)


def test_a_running_jobs_output_grows(site: Site, browser: Any) -> None:
    browser.get(site.base + f"/ui/jobs/{site.ids['job']}")
    first = text_of(browser, "#job-output")
    assert text_of(browser, "#job-state") == "running"
    # job.js polls the output: the text grows without a reload
    wait_for(browser, lambda d: len(d.find_element("id", "job-output").text) > len(first) + 10)
    assert "tick" in text_of(browser, "#job-output")
    shot(browser, site.tmp, "job")


# --- the boundaries -------------------------------------------------------------------------------
def test_a_write_without_the_csrf_token_is_refused(site: Site, browser: Any) -> None:
    cookie = {"kernmind_ui": browser.get_cookie("kernmind_ui")["value"]}
    pid = site.ids["evil"]
    url = f"{site.base}/ui/memory/passages/{pid}/delete"
    refused = httpx2.post(url, cookies=cookie, data={}, timeout=30)
    assert refused.status_code == 403
    wrong = httpx2.post(url, cookies=cookie, data={"csrf": "not-it"}, timeout=30)
    assert wrong.status_code == 403
    assert site.get(f"/ui/memory/passages/{pid}").status_code == 200  # still there
    # the page's own form (with its token) does delete
    browser.get(f"{site.base}/ui/memory/passages/{pid}")
    browser.find_element("xpath", "//button[text()='Delete this passage']").click()
    wait_for(browser, lambda d: "Deleted passage" in d.page_source)
    assert site.get(f"/ui/memory/passages/{pid}").status_code == 404


def test_another_principals_ids_answer_404(site: Site) -> None:
    for path in (
        f"/ui/memory/passages/{site.ids['bob_passage']}",
        "/ui/memory/blocks/bobs_block",
        "/ui/sessions/bobs",
        "/ui/sessions/bobs/notebook.ipynb",
        f"/ui/jobs/{site.ids['bob_job']}",
        f"/ui/jobs/{site.ids['bob_job']}/output",
        "/ui/principals",
    ):
        assert site.get(path).status_code == 404, path
        assert site.get(path, "bob").status_code in (200, 404 if path == "/ui/principals" else 200), path
    forged = httpx2.post(
        f"{site.base}/ui/memory/passages/{site.ids['bob_passage']}/delete",
        headers={"Authorization": f"Bearer {site.tokens['alice']}"},
        timeout=30,
    )
    assert forged.status_code == 404
    assert site.get(f"/ui/memory/passages/{site.ids['bob_passage']}", "bob").status_code == 200
    assert site.get("/ui/memory/blocks", "nobody" if False else "alice").status_code == 200
    assert httpx2.get(site.base + "/ui/memory/blocks", timeout=30).status_code == 303  # to the login page


def test_the_admin_sees_per_principal_usage(site: Site) -> None:
    page = site.get("/ui/principals", "root")
    assert page.status_code == 200
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>([a-z~0-9]+)</td>.*?</tr>", page.text)}
    assert "alice" in rows and "bob" in rows
    assert re.search(r"<td>[1-9]\d*</td><td>[1-9]", rows["alice"])  # sessions, and passages counted


def test_supersede_from_the_page_and_a_stale_undo_is_refused(site: Site, browser: Any) -> None:
    browser.get(site.base + "/ui/memory/search?q=Oslo")
    browser.find_element("partial link text", "#").click()
    wait_for(browser, lambda d: d.find_elements("id", "passage-content"))
    old_url = browser.current_url
    box = browser.find_element("name", "content")
    box.clear()
    box.send_keys("Mira moved to Trondheim")
    browser.find_element("xpath", "//button[text()='Supersede with this text']").click()
    wait_for(browser, lambda d: "which supersedes passage" in d.page_source)
    assert text_of(browser, "#passage-content") == "Mira moved to Trondheim"
    assert re.search(r"replaces #\d+", text_of(browser, "main"))
    browser.get(old_url)
    assert re.search(r"replaced by #\d+", text_of(browser, "main"))
    # an undo sent with a version the block has left behind changes nothing (expected_version)
    before = site.get("/ui/memory/blocks/plans").text
    stale = httpx2.post(
        f"{site.base}/ui/memory/blocks/plans/undo",
        headers={"Authorization": f"Bearer {site.tokens['alice']}"},
        data={"expected_version": "1"},
        timeout=30,
    )
    assert stale.status_code == 409 and "version" in stale.text
    after = site.get("/ui/memory/blocks/plans").text
    version = re.compile(r'id="block-version">(\d+)<')
    assert version.search(before).group(1) == version.search(after).group(1)

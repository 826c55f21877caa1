"""install_packages through a real in-process server: packages reach the running kernel and
the session's other runners, stay within their session, and every refusal is a sentence.

Packages come from a wheelhouse the test builds (``--find-links``, no index) and npm
packages from a registry it serves on 127.0.0.1; nothing needs the internet.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server
from tests.conftest import error_text, make_settings, structured
from tests.execution.packages.package_sources import NpmRegistry, make_sdist, make_wheel

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("packages"), pytest.mark.slow]

LEFTPAD = "module.exports = (s, n, c = '.') => String(s).padStart(n, c);"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheelhouse")
    d.chmod(0o755)
    make_wheel(d, "alpha", "1.0", requires=("beta>=1",))
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "gamma-tool", "1.0", modules={"gamma_tool/__init__.py": "ANSWER = 42\n"})
    make_sdist(d, "sourceonly", "1.0")
    make_sdist(d, "sourceonly", "1.1")  # uv then says "all versions of sourceonly have no usable wheels"
    return d


@pytest.fixture(scope="module")
def registry() -> Iterator[NpmRegistry]:
    with NpmRegistry({"leftpad": {"1.0.0": LEFTPAD}}).running() as reg:
        os.environ["NPM_CONFIG_REGISTRY"] = f"{reg.url}/"  # the host's npm setting, as an operator sets it
        try:
            yield reg
        finally:
            os.environ.pop("NPM_CONFIG_REGISTRY", None)


@pytest.fixture(scope="module")
async def client(
    tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path, registry: NpmRegistry
) -> AsyncIterator[Client]:
    settings = make_settings(
        tmp_path_factory.mktemp("server"), pool_size=1, package_index="none", find_links=str(wheelhouse)
    )
    async with Client(create_server(settings)) as c:
        yield c


async def run(client: Client, code: str, **kw: object) -> dict:
    return structured(await client.call_tool("run_code", {"code": code, **kw}))


async def install(client: Client, packages: list[str], **kw: object) -> dict:
    return structured(await client.call_tool("install_packages", {"packages": packages, **kw}))


async def refusal(client: Client, packages: list[str], **kw: object) -> str:
    return error_text(await client.call_tool("install_packages", {"packages": packages, **kw}))


# --- Python --------------------------------------------------------------------------------
async def test_installed_package_imports_in_the_running_kernel_without_restart(client: Client) -> None:
    before = await run(client, "import alpha", session_id="live")
    assert before["status"] == "error" and before["error"]["name"] == "ModuleNotFoundError"
    await run(client, "kept = 'state'", session_id="live")
    result = await install(client, ["alpha"], session_id="live")
    assert {p["name"]: p["version"] for p in result["installed"]} == {"alpha": "1.0", "beta": "2.0"}
    assert result["session_id"] == "live" and result["duration_ms"] > 0
    assert any("importable now" in n for n in result["notes"])
    after = await run(client, "import alpha, beta\nalpha.VERSION, beta.VERSION, kept", session_id="live")
    assert after["status"] == "ok", after
    assert after["results"][0]["text"] == "('1.0', '2.0', 'state')"


async def test_packages_survive_reset_and_reach_bash_of_the_same_session(client: Client) -> None:
    await install(client, ["gamma-tool"], session_id="carry")
    out = await run(client, "import gamma_tool; gamma_tool.ANSWER", session_id="carry", reset=True)
    assert out["results"][0]["text"] == "42"
    bash = await run(
        client,
        'python3 -c "import gamma_tool; print(gamma_tool.ANSWER)"',
        language="bash",
        session_id="carry",
    )
    assert bash["status"] == "ok", bash
    assert bash["logs"]["stdout"] == ["42\n"]


async def test_another_session_does_not_see_them(client: Client) -> None:
    await install(client, ["gamma-tool"], session_id="mine")
    other = await run(client, "import gamma_tool", session_id="not-mine")
    assert other["status"] == "error" and other["error"]["name"] == "ModuleNotFoundError"


async def test_packages_go_with_the_session(client: Client) -> None:
    await install(client, ["gamma-tool"], session_id="short-lived")
    assert structured(await client.call_tool("close_session", {"session_id": "short-lived"}))["closed"]
    fresh = await run(client, "import gamma_tool", session_id="short-lived")
    assert fresh["status"] == "error"


async def test_refusals_are_sentences(client: Client) -> None:
    text = await refusal(client, ["sourceonly"], session_id="refused")
    assert "only source code" in text and "--allow-sdist" in text
    text = await refusal(client, ["no-such-package"], session_id="refused")
    assert "no package named 'no-such-package'" in text
    text = await refusal(client, ["ggplot2"], language="r", session_id="refused")
    assert "language='python'" in text and "javascript" in text
    text = await refusal(client, ["-e ."], session_id="refused")
    assert "command-line option" in text


# --- installing from inside code ----------------------------------------------------------
@pytest.mark.parametrize(
    "code", ["!pip install openpyxl", "%pip install openpyxl", "!uv pip install openpyxl"]
)
async def test_installing_from_python_code_is_an_error_naming_the_tool(client: Client, code: str) -> None:
    out = await run(client, code, session_id="inside")
    assert out["status"] == "error"
    assert out["error"]["name"] == "InstallFromCodeRefused"
    assert "install_packages" in out["error"]["value"]


@pytest.mark.parametrize("command", ["pip install openpyxl", "uv pip install openpyxl", "npm install lodash"])
async def test_installing_from_bash_fails_at_once_naming_the_tool(client: Client, command: str) -> None:
    out = await run(client, command, language="bash", session_id="inside")
    assert out["status"] == "error" and out["error"]["name"] == "NonZeroExit"
    assert "install_packages" in "".join(out["logs"]["stderr"])


async def test_a_failing_shell_command_in_a_cell_is_visible(client: Client) -> None:
    out = await run(client, "!ls /no/such/dir", session_id="inside")
    assert "exited with code 2" in "".join(out["logs"]["stderr"])


# --- npm for JavaScript/TypeScript -----------------------------------------------------------
async def test_npm_package_prefetched_then_imported_offline(client: Client, registry: NpmRegistry) -> None:
    before = await run(
        client, 'import pad from "npm:leftpad@1";\npad(7, 3)', language="javascript", session_id="js"
    )
    assert before["status"] == "error" and "install_packages" in before["error"]["value"]
    result = await install(client, ["npm:leftpad@1"], language="javascript", session_id="js")
    assert [(p["name"], p["version"]) for p in result["installed"]] == [("leftpad", "1.0.0")]
    for language in ("javascript", "typescript"):
        out = await run(
            client, 'import pad from "npm:leftpad@1";\npad(7, 3)', language=language, session_id="js"
        )
        assert out["status"] == "ok", (out["error"], out["logs"])
        assert out["results"][0]["text"] == "'..7'"


async def test_stateless_servers_offer_only_the_tools_that_work_there(tmp_path: Path) -> None:
    """Installs, file tools, workspace resources and notebooks would always refuse with
    --stateless (nothing lasts past a call): they are not listed, and run_code does not point at them."""
    async with Client(create_server(make_settings(tmp_path / "full", pool_size=0))) as c:
        full = {t.name for t in (await c.list_tools()).tools}
        full_templates = {t.name for t in (await c.list_resource_templates()).resource_templates}
    async with Client(create_server(make_settings(tmp_path / "bare", pool_size=0, stateless=True))) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        templates = {t.name for t in (await c.list_resource_templates()).resource_templates}
        answer = await c.call_tool("install_packages", {"packages": ["alpha"]})
    assert full - set(tools) == {
        "install_packages",
        "upload_file",
        "download_file",
        "list_files",
        "export_notebook",
    }
    assert {"run_code", "list_sessions", "job_status", "job_cancel"} <= set(tools)
    assert {"workspace_file", "workspace_listing"} <= full_templates
    assert not templates & {"workspace_file", "workspace_listing"}
    description = tools["run_code"].description or ""
    assert "install_packages" not in description and "--stateless" in description
    assert answer.is_error and "install_packages" in error_text(answer)


async def test_policy_none_refuses_and_the_description_says_so(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, pool_size=0, packages="none"))) as c:
        text = error_text(await c.call_tool("install_packages", {"packages": ["alpha"]}))
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert "--packages none" in text
    assert "Installing packages is turned off" in (tools["run_code"].description or "")

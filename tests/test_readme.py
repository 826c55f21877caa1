"""README's commands work as written: every command in its ``bash`` blocks is run or checked,
and its JSON examples are true: each ``json`` block says what it shows in an HTML comment
(the arguments of a tool, a tool's real result for given arguments, part of a result, a client
config; see "the JSON examples" below) and is checked against a real server, and every inline
``{…}`` on a line that names a tool is valid arguments for it.

The same holds for the pages under ``docs/``, and every relative link in README, ``docs/`` and
``benchmarks/README.md`` must point at a file (and a heading) that exists. README stays one
page (at most 300 lines).

The test reads README.md like a newcomer: each ``##`` section's commands in order, in one
emulated shell session per section that starts *without* kernmind on ``PATH`` (a fresh
terminal), so ``. .venv/bin/activate`` and ``export KERNMIND_TOKEN=…`` carry over to the
section's later commands exactly as they would for a reader — and a section that forgets
to activate the environment fails. Each command must match one rule below, or the test fails and names
it: a new README command needs a check here.

What is changed, and why: the environment gives every server a private data directory and
HOME, ``KERNMIND_PORT=0`` (a free port, because several test runs share this machine) and
``KERNMIND_POOL_SIZE=0`` (no warm kernels to start); ``npx -y @modelcontextprotocol/
inspector@2.12.0`` is replaced by the same version installed under ``build/inspector`` (no
network in tests); the HTTP Inspector example gets the started server's real URL. Commands
that need root and the network (``apt-get``, ``pip install`` from PyPI) are checked for
their effect (``bwrap`` present, the extras importable) — ``.ci/run`` runs them for real on
a fresh machine, and the two fresh-machine commands must stay verbatim.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.scripted_openai import ScriptedOpenAI, call, reply, tools
from tests.transport.procs import URL_LINE, http_client

pytestmark = [pytest.mark.xdist_group("transport"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]  # the pages whose commands are run
LINKED = [*PAGES, REPO / "benchmarks" / "README.md"]  # the pages whose links are checked
VENV = REPO / ".venv"
INSPECTOR = REPO / "build" / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
NPX_INSPECTOR = re.compile(r"^npx -y @modelcontextprotocol/inspector@(\S+) ")
FRESH_MACHINE_SERVER = (
    "sudo apt-get update && sudo apt-get install -y bubblewrap python3-venv && python3 -m venv .venv && "
    '.venv/bin/pip install ".[datascience]" && .venv/bin/kernmind doctor && .venv/bin/kernmind serve --transport http'
)
FRESH_MACHINE_TESTS = (
    "sudo apt-get update && sudo apt-get install -y python3-venv && python3 -m venv .venv && "
    ". .venv/bin/activate && bash .ci/run"
)
TEST_COMMAND = "python3 -m pytest -n 3 --dist loadfile -q"


def readme_sections() -> list[list[str]]:
    """The commands of each ``##`` section's ``bash`` blocks of README then of each page in
    ``docs/``: continuations joined, comments dropped."""
    return [commands for page in PAGES for commands in page_sections(page)]


def page_sections(page: Path) -> list[list[str]]:
    sections = re.split(r"^## ", page.read_text(encoding="utf-8"), flags=re.M)
    out = []
    for section in sections:
        commands = []
        for block in re.findall(r"```bash\n(.*?)```", section, re.S):
            joined = re.sub(r"\\\n\s*", "", block)
            lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
            commands += [c for c in lines if c and not c.startswith("#")]
        if commands:
            out.append(commands)
    return out


# --- the emulated shell -------------------------------------------------------------------------
@dataclass
class Shell:
    tmp: Path
    env: dict[str, str]
    inspector_skipped: str | None = None
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def fresh(cls, tmp: Path) -> Shell:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNMIND_", "VIRTUAL_ENV"))}
        venv_bin = str(Path(sys.prefix) / "bin")
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
        (tmp / "home").mkdir()
        env.update(
            HOME=str(tmp / "home"),
            KERNMIND_DATA_DIR=str(tmp / "data"),
            KERNMIND_PORT="0",
            KERNMIND_POOL_SIZE="0",
            PYTHONUNBUFFERED="1",
        )
        return cls(tmp, env)

    def run(
        self, command: str, *, cwd: Path = REPO, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def adopt(self, command: str) -> None:
        """Run ``command`` and keep the environment it leaves (``. activate``, ``export``)."""
        proc = subprocess.run(
            ["bash", "-c", f"{command} && env -0"], cwd=REPO, env=self.env, capture_output=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr.decode()
        self.env = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if "=" in item)

    def start(self, command: str, *, stdin: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"server-{len(self.started)}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # stop the whole command line, as Ctrl-C would
            )
        self.started.append(proc)
        return proc, log

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(30)

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_for_url(proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = URL_LINE.search(log.read_text(errors="replace"))
        if match:
            return match.group(1)
        assert proc.poll() is None, log.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError(f"no URL within {timeout}s:\n{log.read_text(errors='replace')}")


def list_tools_over_http(url: str, token: str | None) -> set[str]:
    async def go() -> set[str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with anyio.fail_after(60):
            async with http_client(url, headers, "auto") as client:
                return {t.name for t in (await client.list_tools()).tools}

    return anyio.run(go)


# --- the rules: one per kind of README command --------------------------------------------------
def check_fresh_machine_server(shell: Shell, command: str) -> None:
    assert command == FRESH_MACHINE_SERVER, "README's first fresh-machine command must stay verbatim"
    tail = command.split('.venv/bin/pip install ".[datascience]" && ', 1)[1]  # apt and pip: see .ci/run
    proc, log = shell.start(tail)
    url = wait_for_url(proc, log, timeout=180)  # after `kernmind doctor` passed
    assert "run_code" in list_tools_over_http(url, None)
    assert shell.stop(proc) == 0, log.read_text()


def check_fresh_machine_tests(shell: Shell, command: str) -> None:
    assert command == FRESH_MACHINE_TESTS, "README's second fresh-machine command must stay verbatim"
    assert (REPO / ".ci" / "run").is_file()  # this very suite is what it runs


def check_test_command(shell: Shell, command: str) -> None:
    lines = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[-1] == command == TEST_COMMAND, "README says .ci/run ends with this command"


def check_bubblewrap_installed(shell: Shell, command: str) -> None:
    assert shutil.which("bwrap"), "bubblewrap is not installed (.ci/run installs it)"


def check_new_venv(shell: Shell, command: str) -> None:
    fresh = shell.tmp / "fresh"
    fresh.mkdir()
    proc = shell.run(f"{command} && python -c 'import sys; print(sys.prefix)'", cwd=fresh, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == fresh / ".venv"
    shell.adopt(". .venv/bin/activate")  # and the repository's .venv is that venv after `pip install`


def check_extras_installed(shell: Shell, command: str) -> None:
    proc = shell.run("python -c 'import numpy, pandas, matplotlib, scipy, sklearn, kernmind'")
    assert proc.returncode == 0, f"{command!r} did not leave the data-science extras installed: {proc.stderr}"


def check_doctor(shell: Shell, command: str) -> None:
    proc = shell.run(command)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def check_activate(shell: Shell, command: str) -> None:
    shell.adopt(command)


def check_export(shell: Shell, command: str) -> None:
    shell.adopt(command)


def check_serve_stdio(shell: Shell, command: str) -> None:
    proc, log = shell.start(command, stdin=True)
    assert proc.stdin is not None and proc.stdout is not None
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "readme", "version": "0"},
        },
    }
    proc.stdin.write(json.dumps(init).encode() + b"\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 90)
    assert ready, log.read_text()
    line = proc.stdout.readline()
    assert line, f"{command!r} did not answer: {log.read_text(errors='replace')}"
    answer = json.loads(line)
    assert answer["result"]["serverInfo"]["name"] == "kernmind", answer
    proc.stdin.close()
    assert proc.wait(30) == 0, log.read_text()


def check_serve_http(shell: Shell, command: str) -> None:
    proc, log = shell.start(command)
    url = wait_for_url(proc, log)
    assert "run_code" in list_tools_over_http(url, shell.env.get("KERNMIND_TOKEN"))
    assert shell.stop(proc) == 0, log.read_text()


def check_agent(shell: Shell, command: str) -> None:
    llm = ScriptedOpenAI().start()
    try:
        llm.add(tools(call("run_code", {"code": "a, b = 0, 1\nfor _ in range(20): a, b = b, a + b\na"})))
        llm.add(reply("The 20th Fibonacci number is 6765."))
        shell.env.update(OPENAI_API_KEY="test-key", OPENAI_BASE_URL=llm.url)
        proc = shell.run(command)
    finally:
        llm.stop()
        for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            shell.env.pop(key)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The 20th Fibonacci number is 6765.\n"
    tool_message = next(m for m in llm.requests[1]["messages"] if m["role"] == "tool")
    assert "6765" in tool_message["content"]


def check_inspector(shell: Shell, command: str) -> None:
    pinned = NPX_INSPECTOR.match(command)
    assert pinned, command
    if not INSPECTOR.exists() or shutil.which("node") is None:
        shell.inspector_skipped = (
            "MCP Inspector not installed under build/inspector (bash .ci/run installs it)"
        )
        return
    package = INSPECTOR.parents[1] / "@modelcontextprotocol" / "inspector" / "package.json"
    assert json.loads(package.read_text())["version"] == pinned.group(1), "README pins another version"
    local = command.replace(pinned.group(0), f"{INSPECTOR} ")
    server = None
    if "http://127.0.0.1:8765/mcp" in local:
        server, log = shell.start("kernmind serve --transport http")
        local = local.replace("http://127.0.0.1:8765/mcp", wait_for_url(server, log))
    try:
        proc = shell.run(local)
    finally:
        if server is not None:
            assert shell.stop(server) == 0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert "tools" in result or result.get("isError") is False, result


Rule = tuple[str, Callable[[Shell, str], None]]
RULES: list[Rule] = [
    (r"^sudo apt-get update && .* \.venv/bin/kernmind serve --transport http$", check_fresh_machine_server),
    (r"^sudo apt-get update && .* bash \.ci/run$", check_fresh_machine_tests),
    (rf"^{re.escape(TEST_COMMAND)}$", check_test_command),
    (r"^sudo apt-get install -y bubblewrap$", check_bubblewrap_installed),
    (r"^python3 -m venv \.venv && \. \.venv/bin/activate$", check_new_venv),
    (r'^pip install "\.\[datascience\]"$', check_extras_installed),
    (r"^kernmind doctor$", check_doctor),
    (r"^\. \.venv/bin/activate$", check_activate),
    (r"^export KERNMIND_TOKEN=\$\(openssl rand -hex 24\)$", check_export),
    (r"^kernmind serve$", check_serve_stdio),
    (r"^kernmind serve --transport http( --host 0\.0\.0\.0)?$", check_serve_http),
    (r'^kernmind agent -p "[^"]+"$', check_agent),
    (r"^npx -y @modelcontextprotocol/inspector@", check_inspector),
]


def rule_for(command: str) -> Callable[[Shell, str], None]:
    matches = [check for pattern, check in RULES if re.search(pattern, command)]
    assert len(matches) == 1, f"README command without exactly one check in tests/test_readme.py: {command!r}"
    return matches[0]


def test_every_readme_command_has_a_check() -> None:
    commands = [c for section in readme_sections() for c in section]
    assert len(commands) >= 15
    for command in commands:
        rule_for(command)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to -)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_readme_is_one_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in LINKED:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_file_a_page_names_exists() -> None:
    """A `name.py` (or `room/name.py`) in README or docs/ is a file of the repository: a page
    that names a module merged away or renamed is out of date."""
    ours = [
        p.relative_to(REPO).as_posix()
        for d in ("src", "tests", "benchmarks", ".ci")
        for p in (REPO / d).rglob("*")
    ]
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name in re.findall(r"`([\w./-]+\.(?:py|java))`", line):
                if not any(f == name or f.endswith("/" + name) for f in ours):
                    missing.append(f"{page.relative_to(REPO)}:{n}: {name}")
    assert not missing, "\n".join(missing)


@pytest.fixture
def shells(tmp_path: Path) -> Iterator[Callable[[], Shell]]:
    if not (VENV / "bin" / "kernmind").exists():
        pytest.skip(
            "README's commands use the repository's .venv (the one-command setup or .ci/run makes it)"
        )
    made: list[Shell] = []

    def fresh() -> Shell:
        home = tmp_path / f"shell-{len(made)}"
        home.mkdir()
        made.append(Shell.fresh(home))
        return made[-1]

    try:
        yield fresh
    finally:
        for sh in made:
            sh.close()


def test_readme_commands_work_as_written(shells: Callable[[], Shell]) -> None:
    skipped = None
    for section in readme_sections():
        shell = shells()
        for command in section:
            rule_for(command)(shell, command)
        skipped = skipped or shell.inspector_skipped
    if skipped:
        pytest.skip(f"all other README commands passed; {skipped}")


# --- the JSON examples ----------------------------------------------------------------------------
# Every ```json block in README and docs/ follows an HTML comment that says what it shows:
#   <!-- example: arguments of TOOL -->           one object (or one per line), valid for TOOL's input schema
#   <!-- example: result of TOOL {ARGS} -->       TOOL's structured result for ARGS on a real server: the same
#                                                 keys at every level, the same strings (one ending in "…" is a
#                                                 prefix), booleans, nulls and integers; other numbers by type.
#                                                 Without {ARGS}: the arguments block just before it.
#   <!-- example: part of a TOOL result -->       some of TOOL's result: each key it shows is in the output
#                                                 schema, with a value of the schema's type
#   <!-- example: client config -->               an mcpServers file the agent reads, whose args kernmind parses
EXAMPLE = re.compile(r"(?:<!-- example: (?P<what>.*?) -->\n)?```json\n(?P<body>.*?)```", re.S)
KINDS = re.compile(
    r"^(?:arguments of (?P<args>\w+)|result of (?P<result>\w+)(?: (?P<call>\{.*\}))?"
    r"|part of an? (?P<part>\w+) result|(?P<config>client config))$"
)


@dataclass
class Example:
    page: Path
    line: int
    what: str | None
    body: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def objects(self) -> list[Any]:
        try:
            return [json.loads(self.body)]
        except json.JSONDecodeError:
            return [json.loads(line) for line in self.body.splitlines() if line.strip()]


def json_examples(pages: list[Path] = PAGES) -> list[Example]:
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for m in EXAMPLE.finditer(text):
            found.append(
                Example(page, text.count("\n", 0, m.start("body")), m.group("what"), m.group("body"))
            )
    return found


INLINE_TOOL = re.compile(r"^(?:\| `(\w+)` \||\*\*`(\w+)`\*\* — )")


def inline_arguments(pages: list[Path] = PAGES) -> list[tuple[str, str, Any]]:
    """``(where, tool, arguments)`` for each inline `{…}` that parses as JSON on a line that names a
    tool first (a table row ``| `tool` |`` or a paragraph ``**`tool`** —``)."""
    found = []
    for page in pages:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if not (m := INLINE_TOOL.match(line)):
                continue
            for span in re.findall(r"`(\{.*?\})`", line):
                try:
                    found.append((f"{page.relative_to(REPO)}:{n}", m[1] or m[2], json.loads(span)))
                except json.JSONDecodeError:
                    continue  # a sketch such as {"job_id": …}
    return found


def shape_mismatches(example: Any, real: Any, path: str = "$") -> list[str]:
    """Where ``example`` differs from ``real`` (see the comment above: keys, stable values, types)."""
    if isinstance(example, dict) and isinstance(real, dict):
        out = []
        if extra := sorted(set(example) - set(real)):
            out.append(f"{path}: the example has {extra}, the real result does not")
        if missing := sorted(set(real) - set(example)):
            out.append(f"{path}: the real result has {missing}, the example does not")
        for key in sorted(set(example) & set(real)):
            out += shape_mismatches(example[key], real[key], f"{path}.{key}")
        return out
    if isinstance(example, list) and isinstance(real, list):
        if len(example) != len(real):
            return [f"{path}: {len(example)} items in the example, {len(real)} in the real result {real!r}"]
        return [
            m
            for i, (e, r) in enumerate(zip(example, real, strict=True))
            for m in shape_mismatches(e, r, f"{path}[{i}]")
        ]
    if isinstance(example, float) and isinstance(real, (int, float)) and not isinstance(real, bool):
        return []
    if isinstance(example, str) and isinstance(real, str) and example.endswith("…"):
        return [] if real.startswith(example[:-1]) else [f"{path}: {real!r} does not start as {example!r}"]
    if type(example) is not type(real) or example != real:
        return [f"{path}: the example says {example!r}, the real result {real!r}"]
    return []


def loose(schema: Any) -> Any:
    """``schema`` with nothing required and no unknown key allowed (for part of a result)."""
    if isinstance(schema, dict):
        out = {k: loose(v) for k, v in schema.items() if k != "required"}
        if "properties" in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [loose(v) for v in schema]
    return schema


def test_every_json_example_says_what_it_shows() -> None:
    examples = json_examples()
    assert len(examples) >= 9
    bad = [f"{e}: no <!-- example: … --> comment before it" for e in examples if e.what is None]
    bad += [f"{e}: unknown kind {e.what!r}" for e in examples if e.what and not KINDS.match(e.what)]
    for e in examples:
        try:
            e.objects()
        except json.JSONDecodeError as exc:
            bad.append(f"{e}: not JSON ({exc})")
    assert not bad, "\n".join(bad)


def test_the_example_checks_can_fail() -> None:
    real = {"status": "ok", "results": [{"text": "6"}], "notes": [], "duration_ms": 2.5, "error": None}
    same = {"status": "ok", "results": [{"text": "6"}], "notes": [], "duration_ms": 9.0, "error": None}
    assert shape_mismatches(same, real) == []
    drifted = {
        "status": "ok",
        "results": [{"text": "7"}],
        "background": False,
        "duration_ms": 1,
        "error": None,
    }
    assert shape_mismatches(drifted, real) == [
        "$: the example has ['background'], the real result does not",
        "$: the real result has ['notes'], the example does not",
        "$.duration_ms: the example says 1, the real result 2.5",
        "$.results[0].text: the example says '7', the real result '6'",
    ]
    assert shape_mismatches("the session used…", "the session used more") == []
    assert shape_mismatches("the session used…", "a session used more") != []
    unlabelled = Example(README, 1, None, "{}")
    assert KINDS.match('result of run_code {"code": "1"}') and not KINDS.match("output of run_code")
    assert str(unlabelled) == "README.md:1"


@pytest.mark.anyio
async def test_json_examples_match_real_results(tmp_path: Path) -> None:
    import jsonschema
    from mcp import Client

    from kernmind.agent.config import load_mcp_config
    from kernmind.cli import build_parser
    from kernmind.server import create_server
    from tests.conftest import make_settings

    pytest.importorskip("pandas", reason="the examples use pandas (pip install '.[datascience]')")
    bad: list[str] = []
    settings = make_settings(tmp_path / "data", embedding_model="none", pool_size=0)
    async with Client(create_server(settings)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        last_arguments: dict[str, Any] | None = None
        for e in json_examples():
            kind = KINDS.match(e.what or "")
            assert kind, f"{e}: see test_every_json_example_says_what_it_shows"
            objects = e.objects()
            if name := kind["args"]:
                for obj in objects:
                    try:
                        jsonschema.validate(obj, tools[name].input_schema)
                    except jsonschema.ValidationError as exc:
                        bad.append(f"{e}: not valid {name} arguments: {exc.message}")
                last_arguments = objects[0] if len(objects) == 1 else None
            elif name := kind["result"]:
                arguments = json.loads(kind["call"]) if kind["call"] else last_arguments
                assert arguments is not None, f"{e}: which call? (give its arguments in the comment)"
                result = await client.call_tool(name, arguments)
                assert not result.is_error and result.structured_content is not None, f"{e}: {result.content}"
                bad += [f"{e}: {m}" for m in shape_mismatches(objects[0], result.structured_content)]
                if session := arguments.get("session_id"):  # the next example starts from a fresh session
                    await client.call_tool("close_session", {"session_id": session})
            elif name := kind["part"]:
                try:
                    jsonschema.validate(objects[0], loose(tools[name].output_schema))
                except jsonschema.ValidationError as exc:
                    bad.append(
                        f"{e}: not part of a {name} result: {exc.message} (at {list(exc.absolute_path)})"
                    )
            else:
                config = tmp_path / "mcp.json"
                config.write_text(e.body)
                assert load_mcp_config(config), e
                for server in objects[0]["mcpServers"].values():
                    build_parser().parse_args(server["args"])  # exits on an unknown flag
        for where, name, arguments in inline_arguments():
            if name not in tools:  # a row of the `memory` tool's commands (view, create, …)
                assert arguments.get("command") == name, f"{where}: {name} is no tool"
                name = "memory"
            unknown = sorted(set(arguments) - set(tools[name].input_schema.get("properties", {})))
            if unknown:
                bad.append(f"{where}: {name} takes no {unknown}")
            try:
                jsonschema.validate(arguments, tools[name].input_schema)
            except jsonschema.ValidationError as exc:
                bad.append(f"{where}: not valid {name} arguments: {exc.message}")
    assert len(inline_arguments()) >= 40  # the tables of README and tools.md are read
    assert not bad, "\n".join(bad)

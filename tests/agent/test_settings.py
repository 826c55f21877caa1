"""The agent's settings are declared once (``agent/settings.py``), like the server's: flags,
variables, ``--help`` and docs/configuration.md's agent table are derived from that declaration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernmind.agent.cli import agent_settings_from_args
from kernmind.agent.config import ConfigError
from kernmind.agent.settings import AgentSettings
from kernmind.cli import build_parser
from kernmind.config import Settings
from kernmind.settings_cli import model_specs
from kernmind.settings_docs import agent_markdown_table

from .scripted_openai import ScriptedOpenAI, call, tools
from .test_cli import agent_cmd, toy_config

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SPECS = model_specs(AgentSettings)


def parse(*argv: str) -> AgentSettings:
    return agent_settings_from_args(build_parser("agent").parse_args(["agent", *argv]))


def test_every_agent_setting_is_documented_and_apart_from_the_server_settings() -> None:
    for spec in SPECS:
        assert spec.description, f"AgentSettings.{spec.name} has no description"
    # both land in one argparse namespace: a shared name would make one overwrite the other
    assert not set(AgentSettings.model_fields) & set(Settings.model_fields)


def test_help_lists_every_agent_flag_with_its_variables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "agent", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = out.replace("\n", " ").replace(" ", "")
    for spec in SPECS:
        for env in spec.env_names:
            assert env in flat, env
        if not spec.cli.env_only:
            assert spec.flag in out, spec.flag
    assert "--api-key" not in out  # a secret: variables only
    assert "-p PROMPT" in out and "-q, --quiet" in out


def test_flags_beat_variables_which_beat_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "KERNMIND_AGENT_MAX_STEPS", "KERNMIND_AGENT_JSON"):
        monkeypatch.delenv(name, raising=False)
    assert parse().max_steps == 20 and parse().base_url is None and parse().kernmind is True
    monkeypatch.setenv("KERNMIND_AGENT_MAX_STEPS", "7")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("KERNMIND_AGENT_JSON", "true")
    got = parse()
    assert (got.max_steps, got.base_url, got.api_key, got.json_output) == (
        7,
        "http://127.0.0.1:9/v1",
        "sk-env",
        True,
    )
    got = parse("--max-steps", "3", "--base-url", "http://h/v1", "--no-json", "--no-kernmind", "-q")
    assert (got.max_steps, got.base_url, got.json_output, got.kernmind, got.quiet) == (
        3,
        "http://h/v1",
        False,
        False,
        True,
    )
    monkeypatch.setenv("KERNMIND_AGENT_BASE_URL", "http://ours/v1")  # the agent's own name wins over OpenAI's
    assert parse().base_url == "http://ours/v1"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-steps", "0"], "--max-steps / KERNMIND_AGENT_MAX_STEPS"),
        (["--retries", "-1"], "--retries / KERNMIND_AGENT_RETRIES"),
        (["--temperature", "nan"], "--temperature / KERNMIND_AGENT_TEMPERATURE"),
        (["--tool-timeout", "0"], "--tool-timeout / KERNMIND_AGENT_TOOL_TIMEOUT"),
    ],
)
def test_a_refused_value_names_its_flag_and_variable(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match="invalid settings") as info:
        parse(*argv)
    assert named in str(info.value)


@pytest.mark.slow  # the agent and a server as subprocesses
def test_a_variable_reaches_the_running_agent(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    """``KERNMIND_AGENT_MAX_STEPS`` does what ``--max-steps`` does (exit 3 after that many steps)."""
    llm.add(*(tools(call("echo", {"text": "again"})) for _ in range(3)))
    cmd = agent_cmd(llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path)), "-p", "loop")
    env = {**os.environ, "OPENAI_API_KEY": "k", "KERNMIND_AGENT_MAX_STEPS": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert len(llm.requests) == 2


def test_the_documented_agent_table_is_the_generated_one() -> None:
    page = CONFIGURATION.read_text(encoding="utf-8")
    assert agent_markdown_table() in page, (
        "docs/configuration.md's agent settings table is out of date: "
        "run `python -m kernmind.settings_docs --write docs/configuration.md`"
    )
    for spec in SPECS:
        assert spec.env in agent_markdown_table()

"""Settings are declared once (config.py); flags, --help, the agent's child argv and docs follow.

These tests read as the rules: every setting is documented and reachable from the command
line and the environment with the same meaning; a subcommand shows only the settings it
uses; bad values are refused with a sentence naming the flag; docs/configuration.md's table
is the generated one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernmind.cli import build_parser, main
from kernmind.config import Group, Settings
from kernmind.settings_cli import (
    COMMAND_GROUPS,
    SettingSpec,
    settings_as_args,
    settings_from_args,
    specs,
)
from kernmind.settings_docs import markdown_table, page_with_tables

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def parse(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(list(argv)))


def test_every_setting_is_documented() -> None:
    for spec in specs():
        assert spec.description, (
            f"Settings.{spec.name} has no description (it is the --help and docs/configuration.md text)"
        )


def test_serve_help_lists_every_setting_with_its_variable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for spec in specs():
        assert spec.env in out.replace("\n", " ").replace(" ", ""), spec.env
        if not spec.cli.env_only:
            assert spec.flag in out, spec.flag
    assert "--embedding-api-key" not in out  # a secret: variable only


@pytest.mark.parametrize("command", sorted(COMMAND_GROUPS))
def test_each_subcommand_takes_exactly_its_groups(command: str) -> None:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    flags = {opt for action in sub._actions for opt in action.option_strings}
    for spec in specs():
        if spec.cli.env_only:
            continue
        assert (spec.flag in flags) == (spec.cli.group in COMMAND_GROUPS[command]), (command, spec.flag)


def test_memory_subcommand_has_no_server_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernmind", "memory", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--pool-size", "--sandbox", "--timeout", "--port", "--token", "--stateless"):
        assert flag not in out
    assert "--db" in out and "--agent" in out


def test_flags_beat_variables_beat_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNMIND_POOL_SIZE", "5")
    monkeypatch.setenv("KERNMIND_TIMEOUT", "7")
    monkeypatch.setenv("KERNMIND_STATELESS", "true")
    s = parse("serve", "--pool-size", "3", "--no-stateless")
    assert s.pool_size == 3  # flag
    assert s.timeout == 7  # variable
    assert s.stateless is False  # --no-x beats the variable
    assert s.max_sessions == Settings.model_fields["max_sessions"].default  # default


def test_json_and_choice_settings_from_flags() -> None:
    s = parse("serve", "--memory-default-blocks", '{"notes": "scratch"}', "--sandbox", "none")
    assert s.memory_default_blocks == {"notes": "scratch"} and s.sandbox == "none"
    with pytest.raises(SystemExit):
        parse("serve", "--memory-default-blocks", "{not json")
    with pytest.raises(SystemExit):
        parse("serve", "--sandbox", "docker")


@pytest.mark.parametrize("spec", [s for s in specs() if s.value_type in (int, float)], ids=lambda s: s.name)
@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity"])
def test_every_number_refuses_non_finite_values(
    spec: SettingSpec, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = next(c for c, groups in COMMAND_GROUPS.items() if spec.cli.group in groups)
    assert main([command, f"{spec.flag}={bad}"]) == 2
    err = capsys.readouterr().err
    assert f"{spec.flag} / {spec.env}: must be" in err and repr(bad) in err


def test_a_refused_value_names_flag_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--pool-size", "40", "--timeout", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--pool-size / KERNMIND_POOL_SIZE: must be less than or equal to 32, got '40'" in err
    assert "--timeout / KERNMIND_TIMEOUT" in err
    assert "errors.pydantic.dev" not in err and "Traceback" not in err


def test_agent_child_gets_the_same_settings(tmp_path: Path) -> None:
    """What ``kernmind agent`` passes to the ``kernmind serve`` it launches reproduces its settings."""
    settings = Settings(
        data_dir=tmp_path,
        agent="bob",
        stateless=True,
        allow_network=True,
        pool_size=0,
        timeout=12.5,
        sandbox="none",
        memory_default_blocks={"notes": "scratch"},
        embedding_api_key="sk-secret",
        workspace_files=999,
    )
    args, env = settings_as_args(settings, COMMAND_GROUPS["agent"])
    assert "sk-secret" not in args and env == {"KERNMIND_EMBEDDING_API_KEY": "sk-secret"}
    child = parse("serve", *args)
    child = child.model_copy(update={"embedding_api_key": env["KERNMIND_EMBEDDING_API_KEY"]})
    assert child == settings


def test_default_settings_need_no_flags() -> None:
    args, env = settings_as_args(Settings(stateless=False), COMMAND_GROUPS["agent"])
    assert args == [] and env == {}


def test_configuration_table_is_the_generated_one() -> None:
    doc = CONFIGURATION.read_text(encoding="utf-8")
    assert page_with_tables(doc) == doc, (
        "docs/configuration.md's settings table is out of date: "
        "run `python -m kernmind.settings_docs --write docs/configuration.md`"
    )
    assert markdown_table() in doc


def test_groups_cover_every_command_that_builds_settings() -> None:
    assert set(COMMAND_GROUPS["serve"]) == set(Group)
    for command, groups in COMMAND_GROUPS.items():
        assert Group.LOGGING in groups, command


def test_building_the_serve_command_line_imports_no_other_subcommand() -> None:
    """``kernmind serve`` is on every client's launch path: it must not pay for memory's or the agent's CLI."""
    code = (
        "import sys; from kernmind.cli import build_parser; build_parser('serve'); "
        "print(sorted(m for m in sys.modules if m.startswith(('kernmind.memory', 'kernmind.agent', 'numpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_allowed_origin_is_repeatable_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    s = parse("serve", "--allowed-origin", "https://a.example", "--allowed-origin", "http://localhost:5173")
    assert s.allowed_origin == ["https://a.example", "http://localhost:5173"]
    args, _ = settings_as_args(s, [Group.TRANSPORT])
    assert args == ["--allowed-origin", "https://a.example", "--allowed-origin", "http://localhost:5173"]
    monkeypatch.setenv("KERNMIND_ALLOWED_ORIGIN", "https://b.example, https://c.example")
    assert Settings().allowed_origin == ["https://b.example", "https://c.example"]
    monkeypatch.setenv("KERNMIND_ALLOWED_ORIGIN", '["https://d.example"]')
    assert Settings().allowed_origin == ["https://d.example"]
    for bad in ("*", "https://a.example/path", "ftp://a.example", "null"):
        with pytest.raises(ValueError, match="is not an origin"):
            Settings(allowed_origin=[bad])


def test_per_principal_caps_default_to_half_with_a_tokens_file(tmp_path: Path) -> None:
    alone = Settings(data_dir=tmp_path / "alone", max_sessions=16, max_stored_sessions=100)
    assert (alone.principal_max_sessions, alone.principal_max_stored_sessions) == (16, 100)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "tokens.json").write_text('{"tokens": []}')
    shared = Settings(data_dir=tmp_path / "shared", max_sessions=16, max_stored_mb=1000)
    assert (shared.principal_max_sessions, shared.principal_max_stored_mb) == (8, 500)
    given = Settings(data_dir=tmp_path / "shared", max_sessions=4, max_sessions_per_principal=10)
    assert given.principal_max_sessions == 4  # never above the server-wide bound

"""Settings on the command line, derived from the one declaration in ``config.py``.

Design: a ``Literal`` becomes ``choices``, a ``bool`` ``--x/--no-x``, a repeatable list one flag per
item, a dict or list JSON; anything else is text for pydantic, so a flag and its variable accept the
same values. Error policy: ``describe_settings_error`` gives one sentence per refused setting naming
its flag and variable; the CLI prints it and exits 2.
"""

from __future__ import annotations

import argparse
import json
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from kernmind.config import Settings
from kernmind.setting_meta import Cli, Group
from kernmind.validation_text import problem

ALL_GROUPS: tuple[Group, ...] = tuple(Group)
_NOT_SERVE = (Group.STORAGE, Group.EXECUTION, Group.SANDBOX, Group.MEMORY, Group.LOGGING)
COMMAND_GROUPS: dict[str, tuple[Group, ...]] = {
    "serve": ALL_GROUPS,
    "agent": _NOT_SERVE,  # the agent launches its own stdio server: no transport settings
    "doctor": _NOT_SERVE,
    "memory": (Group.STORAGE, Group.MEMORY, Group.LOGGING),
    "sessions": (Group.STORAGE, Group.EXECUTION, Group.LOGGING),
    "tokens": (Group.STORAGE, Group.PRINCIPALS, Group.LOGGING),
}
GROUP_TITLES: dict[Group, str] = {
    Group.STORAGE: "storage and identity",
    Group.EXECUTION: "code execution",
    Group.SANDBOX: "sandbox and limits",
    Group.TRANSPORT: "transport",
    Group.PRINCIPALS: "principals",
    Group.MEMORY: "memory",
    Group.LOGGING: "logging",
}

Kind = Literal["text", "choice", "bool", "json", "repeat"]


@dataclass(frozen=True)
class SettingSpec:
    """One setting as the command line and the docs see it."""

    name: str
    field: FieldInfo
    cli: Cli
    env_names: tuple[str, ...]  # the variables that set it, first the one shown

    @property
    def env(self) -> str:
        return self.env_names[0]

    @property
    def flag(self) -> str:
        return self.cli.flag or "--" + self.name.replace("_", "-")

    @property
    def option_strings(self) -> list[str]:
        return [self.cli.short, self.flag] if self.cli.short else [self.flag]

    @property
    def value_type(self) -> Any:
        """The annotation without ``| None``."""
        annotation = self.field.annotation
        if get_origin(annotation) in (Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) == 1:
                return rest[0]
        return annotation

    @property
    def kind(self) -> Kind:
        t = self.value_type
        if get_origin(t) is Literal:
            return "choice"
        if t is bool:
            return "bool"
        if self.cli.repeatable:
            return "repeat"
        return "json" if get_origin(t) in (dict, list) or t in (dict, list) else "text"

    @property
    def choices(self) -> list[str]:
        return [str(c) for c in get_args(self.value_type)] if self.kind == "choice" else []

    @property
    def description(self) -> str:
        return self.field.description or ""

    def default(self) -> Any:
        return self.field.get_default(call_default_factory=True)

    def shown_default(self) -> str | None:
        """The default as a person reads it (None when there is none); ``Cli.shown_default`` is Markdown."""
        if self.cli.shown_default is not None:
            return self.cli.shown_default
        value = self.default()
        if value is None or value == []:
            return None
        if isinstance(value, bool):
            return str(value).lower()
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    def help(self) -> str:
        """The ``--help`` line (for a variable-only setting: the variable's line)."""
        parts = [f"default: {_plain(d)}"] if (d := self.shown_default()) is not None else []
        if not self.cli.env_only:
            parts.append("env " + " or ".join(self.env_names))
        text = f"{_plain(self.description)} ({'; '.join(parts)})" if parts else _plain(self.description)
        return (f"{' or '.join(self.env_names)}: {text}" if self.cli.env_only else text).replace("%", "%%")


def _plain(text: str) -> str:
    return text.replace("`", "")


def model_specs(model: type[BaseSettings]) -> list[SettingSpec]:
    """Every setting a settings model declares, in declaration order. A field's variables are its
    ``validation_alias`` choices when it has them (``OPENAI_API_KEY``), else prefix + NAME."""
    prefix = str(model.model_config.get("env_prefix", ""))
    out = []
    for name, field in model.model_fields.items():
        cli = next((m for m in field.metadata if isinstance(m, Cli)), Cli())
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            envs = tuple(str(c) for c in alias.choices if isinstance(c, str))
        else:
            envs = (alias,) if isinstance(alias, str) else (prefix + name.upper(),)
        out.append(SettingSpec(name, field, cli, envs))
    return out


def specs(groups: Iterable[Group] = ALL_GROUPS) -> list[SettingSpec]:
    """Every server setting in these groups, in declaration order."""
    wanted = set(groups)
    return [s for s in model_specs(Settings) if s.cli.group in wanted]


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg} at position {exc.pos})") from exc


def settings_parent(
    groups: Iterable[Group], *, absent_when_not_given: bool = False
) -> argparse.ArgumentParser:
    """A parent parser (``parents=[…]``) with the flags of these groups, one argument group per
    settings group. A flag not given is ``None``, or absent with ``absent_when_not_given`` (for
    nested subparsers, whose "not given" must not overwrite a value given at the outer level)."""
    parent = argparse.ArgumentParser(add_help=False)
    by_group: dict[Group, list[SettingSpec]] = {}
    for spec in specs(groups):
        by_group.setdefault(spec.cli.group, []).append(spec)
    for group, members in by_group.items():
        add_spec_arguments(
            parent, f"{GROUP_TITLES[group]} settings", members, absent_when_not_given=absent_when_not_given
        )
    return parent


def add_spec_arguments(
    parser: argparse.ArgumentParser,
    title: str,
    members: Iterable[SettingSpec],
    *,
    absent_when_not_given: bool = False,
) -> None:
    """One argument group titled ``title`` with these settings' flags (see :func:`settings_parent`)."""
    members = list(members)
    env_only = [s.help() for s in members if s.cli.env_only]
    g = parser.add_argument_group(
        title, description=("variables only: " + "; ".join(env_only)) if env_only else None
    )
    for spec in members:
        if spec.cli.env_only:
            continue
        common: dict[str, Any] = {
            "dest": spec.name,
            "default": argparse.SUPPRESS if absent_when_not_given else None,
            "help": spec.help(),
        }
        if spec.kind == "bool":
            common["action"] = argparse.BooleanOptionalAction
        elif spec.kind == "choice":
            common["choices"] = spec.choices
        else:
            common["metavar"] = spec.cli.metavar or spec.name.upper()
            if spec.kind == "repeat":
                common.update(action="append", help=common["help"] + " (repeatable)")
            else:
                common["type"] = _json_value if spec.kind == "json" else str
        g.add_argument(*spec.option_strings, **common)


def values_from_args(args: argparse.Namespace, members: Iterable[SettingSpec]) -> dict[str, Any]:
    """The values of the flags that were given (a flag not given is ``None`` or absent)."""
    return {s.name: getattr(args, s.name) for s in members if getattr(args, s.name, None) is not None}


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags; flags not given fall back to the environment, then defaults."""
    return Settings(**values_from_args(args, specs()))


def settings_as_args(settings: Settings, groups: Iterable[Group]) -> tuple[list[str], dict[str, str]]:
    """Flags (and, for settings without one, variables) that reproduce ``settings`` in a child."""
    args: list[str] = []
    env: dict[str, str] = {}
    for spec in specs(groups):
        value = getattr(settings, spec.name)
        if value == spec.default():
            continue
        text = json.dumps(value) if spec.kind == "json" else str(value)
        if spec.cli.env_only:
            env[spec.env] = text
        elif spec.kind == "bool":
            args.append(spec.flag if value else "--no-" + spec.flag.removeprefix("--"))
        elif spec.kind == "repeat":
            for item in value:
                args += [spec.flag, str(item)]
        elif value is not None:
            args += [spec.flag, text]
    return args, env


def where_set(name: str, members: Iterable[SettingSpec] | None = None) -> str:
    """How a user sets this setting: ``--pool-size / KERNMIND_POOL_SIZE`` (among ``members``,
    default the server's settings; an alias such as ``OPENAI_API_KEY`` is found too)."""
    pool = list(members) if members is not None else specs()
    spec = next((s for s in pool if s.name == name or name in s.env_names), None)
    if spec is None:
        return name
    envs = " / ".join(spec.env_names)
    return envs if spec.cli.env_only else f"{spec.flag} / {envs}"


def describe_settings_error(exc: ValidationError, members: Iterable[SettingSpec] | None = None) -> str:
    """One line per refused setting, naming its flag and variable."""
    pool = list(members) if members is not None else None
    lines = [
        f"  {where_set(str(err['loc'][0]) if err['loc'] else '', pool)}: {problem(err)}"
        for err in exc.errors(include_url=False)
    ]
    return "invalid settings:\n" + "\n".join(lines)

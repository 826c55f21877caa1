"""``kernmind agent``: flags, building the ``Agent``, one-shot and REPL modes (docs/agent.md).

Design: a thin layer over the Python API; Ctrl-C interrupts a turn in flight, else stops start-up
(one-shot) or prints a hint (REPL). Exit status: 0 answered, 1 the model or a server failed,
2 bad configuration, 3 ``--max-steps`` reached without an answer, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from kernmind.config import Settings

if TYPE_CHECKING:
    from kernmind.agent.config import AgentConfig
    from kernmind.agent.console import ConsoleEvents
    from kernmind.agent.loop import Agent
    from kernmind.agent.settings import AgentSettings

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_MAX_STEPS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from kernmind.agent.settings import AgentSettings
    from kernmind.settings_cli import add_spec_arguments, model_specs

    p = sub.add_parser(
        "agent",
        parents=[common],
        help="run the bundled agent loop",
        description=(
            "An OpenAI-compatible chat model driving MCP servers (by default its own "
            "'kernmind serve', launched with the server settings given here). "
            "The API key comes from OPENAI_API_KEY (or KERNMIND_AGENT_API_KEY)."
        ),
    )
    g = p.add_argument_group("agent")
    g.add_argument("-p", "--prompt", help="one-shot: answer this prompt and exit ('-' reads it from stdin)")
    add_spec_arguments(p, "agent settings", model_specs(AgentSettings))


def agent_settings_from_args(args: argparse.Namespace) -> AgentSettings:
    """The agent's settings from its flags, then ``KERNMIND_AGENT_*`` / ``OPENAI_*``, then defaults;
    a refused value raises :class:`ConfigError` naming the flag and the variable."""
    from pydantic import ValidationError

    from kernmind.agent.errors import ConfigError
    from kernmind.agent.settings import AgentSettings
    from kernmind.settings_cli import describe_settings_error, model_specs, values_from_args

    members = model_specs(AgentSettings)
    try:
        return AgentSettings(**values_from_args(args, members))
    except ValidationError as exc:
        raise ConfigError(describe_settings_error(exc, members)) from exc


def build_config(
    agent: AgentSettings, settings: Settings, *, one_shot: bool, log_level_given: bool
) -> AgentConfig:
    from kernmind.agent.config import (
        DEFAULT_SYSTEM_PROMPT,
        AgentConfig,
        ServerSpec,
        kernmind_server_spec,
        load_mcp_config,
    )
    from kernmind.agent.errors import ConfigError

    servers: list[ServerSpec] = []
    extra = load_mcp_config(agent.mcp_config) if agent.mcp_config else []
    recorder = None
    if agent.kernmind and not any(s.name == "kernmind" for s in extra):
        from kernmind.memory.recorder import ConversationRecorder

        child_level = settings.log_level if log_level_given else "WARNING"
        servers.append(kernmind_server_spec(settings, log_level=child_level))
        recorder = ConversationRecorder(settings)  # into the namespace of the server it launches
    servers += extra
    if not servers:
        raise ConfigError("no MCP servers: drop --no-kernmind or give --mcp-config")
    return AgentConfig(
        model=agent.model,
        base_url=agent.base_url,
        api_key=agent.api_key,
        servers=servers,
        system_prompt=agent.system if agent.system is not None else DEFAULT_SYSTEM_PROMPT,
        max_steps=agent.max_steps,
        stream=agent.stream if agent.stream is not None else not one_shot,
        images=agent.images,
        temperature=agent.temperature,
        max_retries=agent.retries,
        tool_timeout=agent.tool_timeout,
        connect_timeout=agent.connect_timeout,
        context_window=agent.context_window,
        recorder=recorder,
    )


def _log_level_given(args: argparse.Namespace) -> bool:
    return args.log_level is not None or "KERNMIND_LOG_LEVEL" in os.environ


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not _log_level_given(args) or settings.log_level != "DEBUG":
        for name in ("httpx", "httpx2", "openai", "mcp"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if not _log_level_given(args):
        logging.getLogger("kernmind").setLevel(logging.WARNING)
    import anyio

    from kernmind.agent.endpoint import require_key
    from kernmind.agent.errors import ConfigError

    try:
        agent = agent_settings_from_args(args)
        require_key(agent.base_url, agent.api_key)
    except ConfigError as exc:
        print(f"kernmind agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    try:
        return anyio.run(_main, agent, settings, prompt, _log_level_given(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


async def _main(args: AgentSettings, settings: Settings, prompt: str | None, log_level_given: bool) -> int:
    import anyio

    from kernmind.agent.endpoint import check_endpoint
    from kernmind.agent.errors import ConfigError, ModelError

    # The endpoint first, with nothing but httpx2 loaded: a wrong URL or key is reported in
    # well under a second, before mcp and openai are imported or any server is launched.
    try:
        endpoint = await check_endpoint(
            args.base_url, args.api_key, args.model, connect_timeout=args.connect_timeout
        )
    except ModelError as exc:
        print(f"kernmind agent: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for note in endpoint.notes:
        print(f"kernmind agent: {note}", file=sys.stderr)
    try:
        config = build_config(args, settings, one_shot=prompt is not None, log_level_given=log_level_given)
    except ConfigError as exc:
        print(f"kernmind agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    config.endpoint = endpoint

    from kernmind.agent.connections import ServerStartError
    from kernmind.agent.console import ConsoleEvents, LineReader
    from kernmind.agent.loop import Agent
    from kernmind.agent.repl import repl

    reader = LineReader()
    events = ConsoleEvents(
        stream_tokens=config.stream and not args.json_output,
        approve=args.approve,
        reader=reader,
        quiet=args.quiet,
    )
    agent = Agent(config, events)
    ready = False  # servers started: in the REPL, Ctrl-C at the prompt only prints a hint
    with anyio.CancelScope() as main_scope:

        def on_sigint() -> None:
            if agent.busy and not agent.interrupting:
                agent.interrupt()
                events.note("^C — cancelling (press again to quit)")
            elif ready and prompt is None and not agent.busy:
                events.note("^C (type /exit or press Ctrl-D to leave)")
            else:  # start-up, one-shot idle, or a second Ctrl-C while cancelling
                main_scope.cancel()

        with _sigint_handler(on_sigint):
            try:
                async with agent:
                    ready = True
                    if prompt is None:
                        return await repl(agent, events, reader, json_out=args.json_output)
                    return await _one_shot(agent, events, prompt, json_out=args.json_output)
            except ServerStartError as exc:
                events.note(f"kernmind agent: {exc}")
                return EXIT_FAILED
            except ModelError as exc:
                events.note(f"kernmind agent: {exc}")
                return EXIT_FAILED
    events.note("kernmind agent: interrupted")
    return EXIT_INTERRUPTED


async def _one_shot(agent: Agent, events: ConsoleEvents, prompt: str, *, json_out: bool) -> int:
    result = await agent.run(prompt)
    if json_out:
        print(json.dumps({**agent.transcript(), **result.to_json()}, ensure_ascii=False, indent=2))
    else:
        events.show_answer(result)  # printed once, streamed or not
    if result.stopped == "max_steps":
        return EXIT_MAX_STEPS
    if result.stopped == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK


@contextlib.contextmanager
def _sigint_handler(callback: Any) -> Any:
    """Route SIGINT to ``callback`` on the event loop (POSIX); no-op where unsupported."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)

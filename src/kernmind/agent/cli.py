"""``kernmind agent``: flags, building the :class:`Agent`, one-shot and REPL modes.

Design: a thin layer over the Python API. ``add_parser`` adds the agent's flags next to
the shared server flags (which are passed through to the ``kernmind serve`` it launches);
``run`` builds an :class:`AgentConfig`, opens the agent and either answers ``-p PROMPT``
(answer on stdout, activity on stderr; ``--json`` prints the transcript instead) or runs
the REPL. Ctrl-C is routed to :meth:`Agent.interrupt` while a turn is in flight (the
running tool call is cancelled, the conversation survives); outside a turn it stops
start-up in one-shot mode and prints a hint at the REPL prompt.

Exit status: 0 answered, 1 the model or a server failed, 2 bad configuration,
3 ``--max-steps`` reached without an answer, 130 interrupted.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmind.config import Settings

if TYPE_CHECKING:
    from kernmind.agent.config import AgentConfig
    from kernmind.agent.console import ConsoleEvents
    from kernmind.agent.loop import Agent

DEFAULT_MODEL = "gpt-4.1-mini"

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_MAX_STEPS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "agent",
        parents=[common],
        help="run the bundled agent loop",
        description=(
            "An OpenAI-compatible chat model driving MCP servers (by default its own "
            "'kernmind serve', launched with the server settings given here). "
            "The API key comes from OPENAI_API_KEY."
        ),
    )
    g = p.add_argument_group("agent")
    g.add_argument("-p", "--prompt", help="one-shot: answer this prompt and exit ('-' reads it from stdin)")
    g.add_argument(
        "--model",
        default=os.environ.get("KERNMIND_AGENT_MODEL", DEFAULT_MODEL),
        help=f"chat model name (default: $KERNMIND_AGENT_MODEL or {DEFAULT_MODEL})",
    )
    g.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1 (default: $OPENAI_BASE_URL or OpenAI)",
    )
    g.add_argument("--mcp-config", type=Path, help="mcp.json-style file with more MCP servers (mcpServers)")
    g.add_argument("--no-kernmind", action="store_true", help="do not launch the built-in kernmind server")
    g.add_argument(
        "--max-steps", type=int, default=20, help="model steps per turn before giving up (default 20)"
    )
    g.add_argument("--approve", action="store_true", help="ask before each tool call (yes / no / always)")
    g.add_argument("--json", action="store_true", help="print a machine-readable transcript on stdout")
    g.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream tokens (default: on in the REPL, off with -p)",
    )
    g.add_argument(
        "--images",
        choices=["auto", "on", "off"],
        default="auto",
        help="send tool images to the model (auto: on, falls back to text if the model refuses)",
    )
    g.add_argument("--system", help="system prompt (replaces the default; memory blocks are still appended)")
    g.add_argument("--temperature", type=float, help="sampling temperature")
    g.add_argument("--retries", type=int, default=4, help="retries for 429/5xx/connection errors (default 4)")
    g.add_argument("--tool-timeout", type=float, help="seconds to wait for one tool call (default: no limit)")
    g.add_argument("-q", "--quiet", action="store_true", help="no tool activity on stderr")


def build_config(args: argparse.Namespace, settings: Settings) -> AgentConfig:
    from kernmind.agent.config import (
        DEFAULT_SYSTEM_PROMPT,
        AgentConfig,
        ConfigError,
        ServerSpec,
        kernmind_server_spec,
        load_mcp_config,
    )

    servers: list[ServerSpec] = []
    extra = load_mcp_config(args.mcp_config) if args.mcp_config else []
    recorder = None
    if not args.no_kernmind and not any(s.name == "kernmind" for s in extra):
        from kernmind.memory.recorder import ConversationRecorder

        child_level = settings.log_level if _log_level_given(args) else "WARNING"
        servers.append(kernmind_server_spec(settings, log_level=child_level))
        recorder = ConversationRecorder(settings)  # into the namespace of the server it launches
    servers += extra
    if not servers:
        raise ConfigError("no MCP servers: drop --no-kernmind or give --mcp-config")
    if args.max_steps < 1:
        raise ConfigError("--max-steps must be at least 1")
    one_shot = args.prompt is not None
    return AgentConfig(
        model=args.model,
        base_url=args.base_url,
        api_key=os.environ.get("OPENAI_API_KEY"),
        servers=servers,
        system_prompt=args.system if args.system is not None else DEFAULT_SYSTEM_PROMPT,
        max_steps=args.max_steps,
        stream=args.stream if args.stream is not None else not one_shot,
        images=args.images,
        temperature=args.temperature,
        max_retries=max(args.retries, 0),
        tool_timeout=args.tool_timeout,
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

    from kernmind.agent.config import ConfigError

    try:
        config = build_config(args, settings)
    except ConfigError as exc:
        print(f"kernmind agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    try:
        return anyio.run(_main, config, args, prompt)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


async def _main(config: AgentConfig, args: argparse.Namespace, prompt: str | None) -> int:
    import anyio

    from kernmind.agent.connections import ServerStartError
    from kernmind.agent.console import ConsoleEvents, LineReader
    from kernmind.agent.loop import Agent
    from kernmind.agent.model import ModelError
    from kernmind.agent.repl import repl

    reader = LineReader()
    events = ConsoleEvents(
        stream_tokens=config.stream and not args.json,
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
                        return await repl(agent, events, reader, json_out=args.json)
                    return await _one_shot(agent, events, prompt, json_out=args.json)
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

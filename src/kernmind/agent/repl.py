"""The interactive REPL: read a line, run a turn, show the answer; slash commands (``HELP``).

Error policy: a model failure is printed and the REPL goes on with the conversation kept; Ctrl-C
during a turn interrupts it (the CLI's handler) and the REPL goes on.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from kernmind.agent.console import ConsoleEvents, LineReader
from kernmind.agent.loop import Agent
from kernmind.agent.model import ModelError

HELP = """commands:
  /reset   forget the conversation (memory blocks are kept)
  /memory  show the memory blocks as the model sees them
  /tools   list the tools the model can call
  /status  the model, its context window and how full it is
  /exit    leave (also /quit or Ctrl-D)
Ctrl-C while the model or a tool is working cancels it; the conversation goes on."""


async def repl(
    agent: Agent,
    events: ConsoleEvents,
    reader: LineReader,
    *,
    json_out: bool = False,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    tools = ", ".join(sorted(agent.hub.tools)) or "none"
    servers = ", ".join(c.name for c in agent.hub.connections) or "none"
    events.note(f"kernmind agent · model {agent.config.model} · servers: {servers}")
    events.note(f"tools: {tools}")
    events.note("type /help for commands, /exit to leave")
    while True:
        line = await reader.readline("\nyou> ")
        if line is None:
            events.note("")
            break
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command = text.split()[0].lower()
            if command in ("/exit", "/quit"):
                break
            if command == "/reset":
                agent.reset()
                events.note("(conversation cleared; memory blocks kept)")
            elif command == "/memory":
                memory = await agent.memory()
                events.note(memory or "(no memory blocks: the servers offer none, or they are empty)")
            elif command == "/tools":
                for name, routed in sorted(agent.hub.tools.items()):
                    desc = (routed.tool.description or "").strip().splitlines()
                    events.note(f"  {name} [{routed.server}] {desc[0] if desc else ''}")
            elif command == "/status":
                events.note(status_text(agent))
            elif command == "/help":
                events.note(HELP)
            else:
                events.note(f"unknown command {command}; /help lists them")
            continue
        try:
            result = await agent.run(text)
        except ModelError as exc:
            events.note(f"error: {exc}")
            continue
        events.show_answer(result)
        if result.stopped == "interrupted":
            events.note("(interrupted — the conversation goes on)")
        elif result.stopped == "max_steps":
            out.write(result.answer + "\n")
            out.flush()
    if json_out:
        out.write(json.dumps(agent.transcript(), ensure_ascii=False, indent=2) + "\n")
        out.flush()
    return 0


def status_text(agent: Agent) -> str:
    """What ``/status`` prints: the model, its window, how full the last request made it."""
    w = agent.window
    endpoint = agent.model.endpoint if agent.model else agent.config.base_url
    lines = [f"model {agent.config.model} at {endpoint}", f"context window: {w.size:,} tokens ({w.source})"]
    if w.last_estimate is None:
        lines.append("context used: nothing sent yet")
    else:
        counted = f"; the endpoint counted {w.last_reported:,}" if w.last_reported else ""
        share = 100 * w.last_estimate / w.size
        lines.append(
            f"context used: ≈ {w.last_estimate:,} of {w.size:,} tokens ({share:.0f} %) by the last request"
            f"{counted}; compaction at {w.threshold:,}"
        )
    lines.append(f"messages in view: {len(agent.messages)}")
    if w.compactions:
        summary = (
            f"; a summary of {len(agent.summary or ''):,} characters stands in for them"
            if agent.summary
            else ""
        )
        lines.append(f"compactions: {len(w.compactions)}, {agent.evicted} messages evicted{summary}")
    else:
        lines.append("compactions: none")
    return "\n".join(lines)

"""``kernmind agent`` as a user runs it: a subprocess talking to the scripted model.

The end-to-end test launches the real ``kernmind serve`` (the agent's default, with the
server flags passed through); the others use the toy server through ``--mcp-config``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .scripted_openai import ScriptedOpenAI, call, error, reply, tools
from .toy_server import secret

pytestmark = pytest.mark.slow  # each test starts the agent (and a server) as subprocesses

TOY = Path(__file__).parent / "toy_server.py"


def agent_cmd(llm: ScriptedOpenAI, *args: str) -> list[str]:
    return [sys.executable, "-m", "kernmind", "agent", "--model", "scripted", "--base-url", llm.url, *args]


def env() -> dict[str, str]:
    return {**os.environ, "OPENAI_API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}


def toy_config(tmp_path: Path, marker: Path | None = None) -> Path:
    entry: dict = {"command": sys.executable, "args": [str(TOY)]}
    if marker is not None:
        entry["env"] = {"TOY_MARKER": str(marker)}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"toy": entry}}))
    return path


def run(cmd: list[str], stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env(), timeout=timeout)


def test_one_shot_end_to_end_with_kernmind_serve(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    llm.add(
        error(429, "slow down", headers={"retry-after": "0"}),
        tools(call("run_code", {"code": "print(6 * 7)"}), content="Let me compute."),
        reply("The answer is 42."),
    )
    flags = ["--sandbox", "none", "--pool-size", "0", "--db", str(db), "--data-dir", str(tmp_path / "data")]
    proc = run(agent_cmd(llm, "-p", "What is 6*7?", *flags))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The answer is 42.\n"
    assert "429" in proc.stderr and "retrying" in proc.stderr
    assert "→ run_code" in proc.stderr and "✓ run_code" in proc.stderr
    assert db.exists()  # --db reached the server the agent launched
    tool_msg = next(m for m in llm.requests[2]["messages"] if m["role"] == "tool")
    assert "42" in tool_msg["content"]


def test_json_transcript(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    llm.add(tools(call("add", {"a": 20, "b": 22})), reply("42"))
    proc = run(
        agent_cmd(llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path)), "-p", "add", "--json")
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["answer"] == "42" and data["stopped"] == "answer" and data["steps"] == 2
    assert data["tool_calls"][0]["name"] == "add" and data["tool_calls"][0]["output"] == "42"
    assert data["servers"] == ["toy"] and "add" in data["tools"]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_approve_no_and_always(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    llm.add(*(tools(call("echo", {"text": f"e{i}"})) for i in range(3)), reply("done"))
    cmd = agent_cmd(
        llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path)), "-p", "echo", "--approve"
    )
    proc = run([*cmd, "--json"], stdin="n\nalways\n")
    assert proc.returncode == 0, proc.stderr
    statuses = [c["status"] for c in json.loads(proc.stdout)["tool_calls"]]
    assert statuses == ["refused", "ok", "ok"]
    assert proc.stderr.count("run it?") == 2  # "always" stopped the questions
    assert "declined" in json.dumps(llm.requests[1]["messages"])


def test_max_steps_and_model_failure_exit_codes(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    cfg = str(toy_config(tmp_path))
    llm.add(*(tools(call("echo", {"text": "again"})) for _ in range(2)))
    proc = run(agent_cmd(llm, "--no-kernmind", "--mcp-config", cfg, "-p", "loop", "--max-steps", "2"))
    assert proc.returncode == 3
    assert "--max-steps" in proc.stderr and proc.stdout == ""

    llm.add(error(500, "model crashed"), error(500, "model crashed"))
    proc = run(agent_cmd(llm, "--no-kernmind", "--mcp-config", cfg, "-p", "hi", "--retries", "1"))
    assert proc.returncode == 1
    assert "HTTP 500" in proc.stderr and "model crashed" in proc.stderr and "after 2 attempts" in proc.stderr

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = run(agent_cmd(llm, "--mcp-config", str(bad), "-p", "hi"))
    assert proc.returncode == 2 and "mcpServers" in proc.stderr


def test_repl_streams_commands_and_ctrl_c_cancels_the_tool(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    marker.touch()
    llm.add(tools(call("slow", {"seconds": 60})), reply("I am still here."))
    cmd = agent_cmd(llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path, marker)))
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write("/memory\nplease sleep\n")
        proc.stdin.flush()
        # The tool has started: the agent is in its turn (busy), so Ctrl-C cancels the call.
        wait_for(lambda: "started" in marker.read_text(), "the slow tool to start")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "cancelled" in marker.read_text(), "the server to see the cancellation")
        proc.stdin.write("are you there?\n/reset\n/exit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "I am still here.\n"
    assert "Name: unknown" in err  # /memory
    assert "⊘ slow cancelled" in err and "conversation goes on" in err
    assert "conversation cleared" in err  # /reset
    last = llm.requests[-1]
    assert last.get("stream") is True
    assert any("cancelled" in str(m.get("content")) for m in last["messages"] if m["role"] == "tool")


def test_stream_one_shot_prints_the_answer_once_to_a_file(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    cfg = str(toy_config(tmp_path))
    llm.add(reply("Streamed answer."))
    proc = run(agent_cmd(llm, "--no-kernmind", "--mcp-config", cfg, "--stream", "-p", "hi"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Streamed answer.\n"
    assert llm.requests[-1].get("stream") is True

    llm.add(tools(call("add", {"a": 20, "b": 22})), reply("The sum is 42."))
    proc = run(agent_cmd(llm, "--no-kernmind", "--mcp-config", cfg, "--stream", "-p", "add"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("The sum is 42.") == 1 and proc.stdout.endswith("The sum is 42.\n")


def test_stream_one_shot_prints_the_answer_once_to_a_terminal(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    llm.add(reply("Streamed answer."))
    cmd = agent_cmd(llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path)), "--stream", "-p", "hi")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, env=env())
    os.close(follower)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(30) == 0
    finally:
        os.close(leader)
        proc.kill()
    assert out.decode() == "Streamed answer.\r\n"


def wait_for(predicate, what: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_compactions_are_noted_on_stderr_and_counted_in_json(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    from .test_window import LongJob

    job = LongJob(steps=14)
    llm.context_window, llm.responder, llm.summarizer = 8000, job.respond, job.summarize
    cfg = str(toy_config(tmp_path))
    prompt = "Run the 14-step job, then tell me step 3's secret."
    cmd = agent_cmd(
        llm, "--no-kernmind", "--mcp-config", cfg, "--context-window", "8000", "-p", prompt, "--json"
    )
    proc = run([*cmd, "--max-steps", "30"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["answer"] == f"Step 3's secret was {secret(3)}."
    assert data["compactions"] >= 2 and data["runs"][0]["compactions"] == data["compactions"]
    assert data["context"]["window"] == 8000 and data["context"]["window_source"] == "--context-window"
    assert len(data["context"]["compaction_log"]) == data["compactions"]
    noted = re.findall(
        r"compacted (\d+) messages into a summary(?: and shortened \d+ tool results?)?; ([\d,]+) of 8,000 tokens",
        proc.stderr,
    )
    evicting = [c for c in data["context"]["compaction_log"] if c["evicted"]]
    assert [int(n) for n, _ in noted] == [c["evicted"] for c in evicting]
    assert all(int(t.replace(",", "")) < 8000 for _, t in noted)


def test_repl_status_shows_the_window_and_its_use(llm: ScriptedOpenAI, tmp_path: Path) -> None:
    llm.models = [{"id": "scripted", "max_model_len": 12000}]
    llm.add(reply("Hello!"))
    cmd = agent_cmd(llm, "--no-kernmind", "--mcp-config", str(toy_config(tmp_path)))
    proc = run(cmd, stdin="/status\nhi\n/status\n/exit\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("context window: 12,000 tokens (the endpoint's model list)") == 2
    first, second = proc.stderr.split("context used:")[1:]
    assert first.startswith(" nothing sent yet") and proc.stdout == "Hello!\n"
    after = second
    used = re.match(
        r" ≈ ([\d,]+) of 12,000 tokens \(\d+ %\) by the last request; the endpoint counted ([\d,]+)", after
    )
    assert used, after
    assert int(used.group(2).replace(",", "")) == llm.accepted[-1]  # the endpoint's own count
    assert "compactions: none" in after

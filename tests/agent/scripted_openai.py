"""A scripted OpenAI-compatible chat-completions server for the agent tests.

It is a real HTTP server on 127.0.0.1 (``http.server`` on a thread, so it serves a
subprocess as well as the test's own event loop). Each ``POST /v1/chat/completions``
takes the next item of the script: an assistant message (rendered as one JSON response,
or as server-sent events when the request asked for ``stream``) or an HTTP error. Every
request body is recorded, so tests can check what the agent sent — the system prompt, the
tool messages, the tool schemas. An exhausted script answers 500 with "script exhausted".

``GET /v1/models`` answers 404 (many servers have no such route) until a test sets
``models`` (the entries of the list, e.g. ``{"id": "scripted", "max_model_len": 8000}``) or
``models_status`` (an error status, e.g. 401 for a refused key).

A model with a window: with ``context_window`` set, each request is counted by the server's
own tokenizer (:func:`count_tokens`: one token per 3.5 characters of the messages, their tool
calls and the tools' schemas, plus 4 a message — deliberately not the agent's estimate) and one
that does not fit is refused with OpenAI's ``context_length_exceeded`` error (HTTP 400), without
using up a script item; ``usage.prompt_tokens`` is that count (in streams too, when asked with
``stream_options``). ``responder`` answers when the script is empty (a function of the request
body, for runs too long to script), and ``summarizer`` answers the agent's summary requests.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Item:
    kind: str  # "message" | "error"
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    payload: dict[str, Any] | None = None  # an error's whole JSON body (default: message and type)


def reply(content: str, *, delay: float = 0.0) -> Item:
    return Item("message", content=content, delay=delay)


def call(name: str, arguments: Any = None, *, id: str | None = None) -> dict[str, Any]:
    """One tool call; ``arguments`` may be a dict (sent as JSON) or a raw string (sent as is)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"id": id, "name": name, "arguments": raw}


def tools(*calls: dict[str, Any], content: str = "") -> Item:
    numbered = [{**c, "id": c["id"] or f"call_{i}_{c['name']}"} for i, c in enumerate(calls)]
    return Item("message", content=content, tool_calls=numbered)


def error(status: int, message: str = "scripted error", headers: dict[str, str] | None = None) -> Item:
    return Item("error", status=status, content=message, headers=headers or {})


SUMMARY_MARKER = "You are summarising the oldest part of a conversation"


def count_tokens(body: dict[str, Any]) -> int:
    """The scripted model's tokenizer: 3.5 characters a token, 4 tokens a message."""
    chars = len(json.dumps(body.get("tools") or [])) if body.get("tools") else 0
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(p.get("text", ""))) if p.get("type") == "text" else 3000 for p in content)
        for c in m.get("tool_calls") or []:
            chars += len(c["function"]["name"]) + len(c["function"]["arguments"])
    return math.ceil(chars / 3.5) + 4 * len(body.get("messages", []))


def is_summary_request(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return str(messages[0].get("content", "")).startswith(SUMMARY_MARKER)


class ScriptedOpenAI:
    def __init__(self) -> None:
        self.script: deque[Item] = deque()
        self.requests: list[dict[str, Any]] = []
        self.models: list[dict[str, Any]] | None = None
        self.models_status: int | None = None
        self.model_listings = 0  # GET /models requests answered
        self.context_window: int | None = None
        self.rejected: list[int] = []  # sizes (tokens) of requests refused as too long
        self.accepted: list[int] = []  # sizes of the requests answered
        self.responder: Callable[[dict[str, Any]], Item] | None = None
        self.summarizer: Callable[[dict[str, Any]], Item] | None = None
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with server._lock:
                    server.model_listings += 1
                item = error(404, f"no route {self.path}")
                if not self.path.endswith("/models"):
                    self._send_json(404, {"error": {"message": item.content}}, item)
                elif server.models_status is not None:
                    message = {401: "Incorrect API key provided"}.get(server.models_status, "scripted error")
                    self._send_json(server.models_status, {"error": {"message": message}}, item)
                elif server.models is None:
                    self._send_json(404, {"error": {"message": item.content}}, item)
                else:
                    entries = [{"object": "model", "owned_by": "scripted", **m} for m in server.models]
                    self._send_json(200, {"object": "list", "data": entries}, Item("message"))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                tokens = count_tokens(body)
                window = server.context_window
                with server._lock:
                    server.requests.append(body)
                    if window is not None and tokens > window:
                        server.rejected.append(tokens)
                        item = _too_long(window, tokens)
                    elif is_summary_request(body) and server.summarizer is not None:
                        item = server.summarizer(body)
                    elif server.script:
                        item = server.script.popleft()
                    elif server.responder is not None:
                        item = server.responder(body)
                    else:
                        item = error(500, "script exhausted")
                    if item.kind != "error":
                        server.accepted.append(tokens)
                if item.delay:
                    time.sleep(item.delay)
                if not self.path.endswith("/chat/completions"):
                    item = error(404, f"no route {self.path}")
                try:
                    if item.kind == "error":
                        payload = item.payload or {"error": {"message": item.content, "type": "scripted"}}
                        self._send_json(item.status, payload, item)
                    elif body.get("stream"):
                        self._send_stream(body, item)
                    else:
                        self._send_json(200, _completion(body, item), item)
                except OSError:
                    pass  # the agent gave up on this request (an interrupt): fine

            def _send_json(self, status: int, payload: dict[str, Any], item: Item) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in item.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _send_stream(self, body: dict[str, Any], item: Item) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                chunks = _chunks(body, item)
                if (body.get("stream_options") or {}).get("include_usage"):
                    chunks.append({**chunks[-1], "choices": [], "usage": _usage(body)})
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up is not a test failure

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, *items: Item) -> None:
        with self._lock:
            self.script.extend(items)

    def system_prompts(self) -> list[str]:
        return [r["messages"][0]["content"] for r in self.requests if r["messages"][0]["role"] == "system"]

    def start(self) -> ScriptedOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _completion(body: dict[str, Any], item: Item) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": item.content or None}
    if item.tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in item.tool_calls
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "scripted"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if item.tool_calls else "stop"}
        ],
        "usage": _usage(body),
    }


def _usage(body: dict[str, Any]) -> dict[str, int]:
    prompt = count_tokens(body)
    return {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}


def _too_long(window: int, tokens: int) -> Item:
    """OpenAI's answer to a request longer than the model's window."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages."
    )
    payload = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    return Item("error", status=400, content=message, payload=payload)


def _chunks(body: dict[str, Any], item: Item) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    text = item.content
    for i in range(0, len(text), 4):  # a few characters per delta, like real servers
        out.append(chunk({"content": text[i : i + 4]}))
    for index, c in enumerate(item.tool_calls):
        head = {
            "index": index,
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": ""},
        }
        out.append(chunk({"tool_calls": [head]}))
        args = c["arguments"]
        for i in range(0, len(args), 5):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 5]}}]}))
    out.append(chunk({}, "tool_calls" if item.tool_calls else "stop"))
    return out

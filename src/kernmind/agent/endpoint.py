"""The model endpoint, checked before anything else starts: reachable, key accepted, its window.

Design: one ``GET {base}/models`` with ``httpx2`` (no ``openai`` or ``mcp`` import), so a wrong URL
or key is reported at once. Error policy: ``ModelError`` only for what no request could get past
(nothing accepting connections, tried twice; the key refused).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio

from kernmind.agent.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

OPENAI_URL = "https://api.openai.com/v1"
# Where OpenAI-compatible servers put a model's window in their /models entry (top level, or one
# level down in ``meta`` / ``top_provider``), in order of preference.
WINDOW_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length", "n_ctx")
REFUSED_RETRY_DELAY = 0.3


@dataclass
class EndpointInfo:
    """What the endpoint said: the models it lists (None: it lists none) and the model's window."""

    url: str
    models: list[str] | None = None
    context_window: int | None = None
    notes: list[str] = field(default_factory=list)  # things worth telling the user, not errors


def endpoint_url(base_url: str | None) -> str:
    return (base_url or OPENAI_URL).rstrip("/")


def require_key(base_url: str | None, api_key: str | None) -> None:
    """OpenAI's own endpoint needs a key; local servers given with ``--base-url`` mostly do not."""
    if not api_key and not base_url:
        raise ConfigError(
            "no API key: set OPENAI_API_KEY (or KERNMIND_AGENT_API_KEY), or point --base-url at a local "
            "OpenAI-compatible server (Ollama, vLLM, LM Studio, llama.cpp) that needs none"
        )


async def check_endpoint(
    base_url: str | None,
    api_key: str | None,
    model: str,
    *,
    connect_timeout: float = 3.0,
    read_timeout: float = 5.0,
) -> EndpointInfo:
    """Raise :class:`ModelError` when nothing answers at the endpoint or it refuses the key."""
    import httpx2

    url = endpoint_url(base_url)
    info = EndpointInfo(url)
    headers = {"Authorization": f"Bearer {api_key or 'not-needed'}"}
    timeout = httpx2.Timeout(read_timeout, connect=connect_timeout)
    async with httpx2.AsyncClient(timeout=timeout, headers=headers) as http:
        for attempt in (1, 2):
            try:
                response = await http.get(f"{url}/models")
                break
            except httpx2.ConnectTimeout as exc:
                raise ModelError(_unreachable(url, f"no answer within {connect_timeout:g} s")) from exc
            except httpx2.ConnectError as exc:
                reason = _connect_reason(exc, url)
                if attempt == 2 or "refused" not in reason:
                    raise ModelError(_unreachable(url, reason)) from exc
                await anyio.sleep(REFUSED_RETRY_DELAY)  # a server that is just starting
            except httpx2.HTTPError as exc:  # reachable, but slow or odd: the chat requests will tell
                log.debug("model endpoint check: %s (going on)", exc)
                return info
    if response.status_code in (401, 403):
        raise ModelError(
            f"the model endpoint {url} refused the API key (HTTP {response.status_code}"
            f"{': ' + detail if (detail := _detail(response)) else ''}): check OPENAI_API_KEY "
            "(or KERNMIND_AGENT_API_KEY), and that the key is for this endpoint",
            status=response.status_code,
        )
    if response.status_code != 200:
        log.debug("model endpoint check: GET /models answered %s (going on)", response.status_code)
        return info
    try:
        entries = [e for e in response.json().get("data", []) if isinstance(e, dict)]
    except (ValueError, AttributeError):
        return info
    info.models = [str(e.get("id")) for e in entries if e.get("id")]
    entry = next((e for e in entries if e.get("id") == model), None)
    if entry is None:
        if info.models:
            shown = ", ".join(info.models[:8]) + (" …" if len(info.models) > 8 else "")
            info.notes.append(
                f"the endpoint does not list model {model!r} (it lists {len(info.models)}: {shown}); "
                "requests for it may fail — check --model"
            )
        return info
    info.context_window = window_of(entry)
    return info


def window_of(entry: dict[str, Any]) -> int | None:
    """The context window a ``/models`` entry reports, if any (see :data:`WINDOW_FIELDS`)."""
    for place in (entry, entry.get("meta"), entry.get("top_provider")):
        if not isinstance(place, dict):
            continue
        for name in WINDOW_FIELDS:
            value = place.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 256:
                return int(value)
    return None


def _unreachable(url: str, reason: str) -> str:
    return (
        f"cannot reach the model endpoint {url} ({reason}). Check that the server is running and "
        "listening at that address, the --base-url / OPENAI_BASE_URL given, and HTTPS_PROXY / "
        "NO_PROXY if a proxy is in the way"
    )


def _connect_reason(exc: BaseException, url: str) -> str:
    text = " ".join(str(e) for e in _chain(exc)).lower()
    if _find(exc, ConnectionRefusedError) is not None or "refused" in text:
        return "connection refused: nothing listens there"
    if _find(exc, socket.gaierror) is not None or "name or service" in text or "nodename" in text:
        return f"host name {urlsplit(url).hostname!r} not found"
    if "unreachable" in text:
        return "network unreachable"
    return f"connection failed: {exc}"


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    return next((e for e in _chain(exc) if isinstance(e, kind)), None)


def _detail(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200].strip()
    err = body.get("error", body) if isinstance(body, dict) else body
    message = err.get("message") if isinstance(err, dict) else err
    return str(message)[:200] if message else ""

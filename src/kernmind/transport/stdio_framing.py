"""JSON-RPC lines on stdio: each line a message in, each message a line out, every bad line answered.

Design: the SDK drops a line its model refuses and the client waits forever; here each is answered
in the HTTP transport's words (bad_messages.py). Error policy: nothing on stdin raises out of here;
a message that cannot be written as JSON is logged under a ref (a response: an internal error for
its id); a closed stdout or a failed reader or writer stops serving in order (exit code 0).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernmind.supervise import failed
from kernmind.transport.bad_messages import (
    INVALID_REQUEST,
    PARSE_ERROR,
    decode,
    error_object,
    form_problem,
    head_id,
    parse_sentence,
    reply_id,
    shape_problem,
)
from kernmind.transport.guard import INTERNAL_ERROR

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ON_ITS_OWN_LINE = "on its own line"
HEAD_BYTES = 4096  # what is kept of a line past the limit (to find its id)
DRAIN_SECONDS = 5.0  # how long the last answers may take to be written once serving ends


@dataclass
class Oversize:
    """A line longer than the limit, read past without keeping it: its first bytes and size."""

    head: bytes
    size: int


Line = bytes | Oversize


class Writer(Protocol):
    async def write(self, text: str) -> None: ...


def oversize_sentence(size: int, limit: int) -> str:
    return (
        f"This message is {size / MIB:.1f} MB; this server accepts messages of at most {limit / MIB:g} MB "
        "(--max-request-mb / KERNMIND_MAX_REQUEST_MB). Nothing was done. Send large data in several "
        "smaller calls (for a file: write it in parts), or ask the server's operator to raise the limit."
    )


def answer_for(line: bytes) -> dict[str, Any] | None:
    """The error a line the SDK's model refused is answered with (None: a blank line)."""
    if not line.strip():
        return None
    message, unreadable = decode(line)
    if unreadable is not None:
        return error_object(None, PARSE_ERROR, parse_sentence(unreadable, per_line=True))
    return error_object(reply_id(message), INVALID_REQUEST, form_problem(message, ON_ITS_OWN_LINE))


@contextlib.asynccontextmanager
async def line_streams(
    lines: AsyncIterator[Line], stdout: Writer, *, max_line: int, on_closed: Callable[[], None]
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[Any]]]:
    """(read stream, write stream) for ``lowlevel.run``, fed from ``lines`` and written to
    ``stdout`` (see the module docstring). ``on_closed`` is called when stdout is gone."""
    from mcp.shared.message import SessionMessage
    from mcp.types import JSONRPCError, JSONRPCNotification, JSONRPCResponse, jsonrpc_message_adapter

    incoming_send, incoming = anyio.create_memory_object_stream[Any](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[Any](0)
    answers = outgoing.clone()  # the reader's own handle: the SDK closing its stream ends nothing here

    async def answer(error: dict[str, Any]) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await answers.send(SessionMessage(JSONRPCError.model_validate(error)))

    async def read() -> None:
        async with incoming_send, answers:
            async for line in lines:
                try:
                    if isinstance(line, Oversize):
                        log.info("refused a %d-byte line on stdin (limit %d)", line.size, max_line)
                        await answer(
                            error_object(
                                head_id(line.head), INVALID_REQUEST, oversize_sentence(line.size, max_line)
                            )
                        )
                        continue
                    try:
                        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except Exception:  # pydantic's ValidationError, and anything else it may raise
                        error = answer_for(line)
                        if error is not None:
                            log.info(
                                "answered an unreadable line on stdin: %s", error["error"]["message"][:200]
                            )
                            await answer(error)
                        continue
                    if isinstance(message, JSONRPCNotification) and b'"id"' in line:
                        # an id of the wrong type made a request into a "notification": say so
                        problem = shape_problem(decode(line)[0], ON_ITS_OWN_LINE)
                        if problem is not None:
                            await answer(error_object(None, INVALID_REQUEST, problem))
                            continue
                    await incoming_send.send(SessionMessage(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the server stopped reading: serving is over
                except Exception as exc:  # one bad line must never stop the reader
                    ref = failed("reading a line on stdin", exc)
                    await answer(
                        error_object(None, INTERNAL_ERROR, f"internal error (ref {ref}) reading this line.")
                    )

    async def write() -> None:
        async with outgoing_receive:
            async for item in outgoing_receive:
                try:
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                except Exception as exc:  # e.g. a lone surrogate in a string
                    ref = failed("writing a message to stdout", exc)
                    rid = getattr(item.message, "id", None)
                    if not isinstance(item.message, JSONRPCResponse | JSONRPCError) or rid is None:
                        continue
                    replacement = JSONRPCError.model_validate(
                        error_object(
                            rid,
                            INTERNAL_ERROR,
                            f"internal error (ref {ref}): the answer could not be written.",
                        )
                    )
                    text = replacement.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    await stdout.write(text + "\n")
                except OSError as exc:  # the client closed our stdout: nobody can be answered
                    log.info("stdout closed by the client (%s): stopping", exc.strerror or exc)
                    on_closed()
                    return

    written = anyio.Event()

    async def reading() -> None:
        try:
            await read()
        except Exception as exc:  # no request can be read any more: stop serving in order
            failed("the stdio reader", exc)
            on_closed()

    async def writing() -> None:
        try:
            await write()
        except Exception as exc:  # no answer can be written any more: stop serving in order
            failed("the stdio writer", exc)
            on_closed()
        finally:
            written.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reading)
        tasks.start_soon(writing)
        try:
            yield incoming, outgoing
            await outgoing.aclose()  # the answers already sent are written, then the writer ends
            with anyio.move_on_after(DRAIN_SECONDS):
                await written.wait()
        finally:
            tasks.cancel_scope.cancel()

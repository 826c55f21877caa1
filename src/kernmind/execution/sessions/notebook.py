"""A session's history as a Jupyter notebook (nbformat 4), for ``export_notebook`` (which call
becomes which cell: docs/tools.md, "Notebooks").

Design: a time-out or a killed interpreter is an ``error`` output too; a raw cell of another
language names it in ``metadata.kernmind.language`` and keeps its output in metadata; every cell
carries ``metadata.kernmind`` (language, status, duration). ``export`` writes a live session's
notebook after its last calls' history lines are on disk (``books.py``).

Error policy: ``build`` raises ``ValueError`` when there is nothing to export (the tools
turn it into a sentence); ``export`` refuses a session that keeps no history (a kernel
gateway's) with a ``SessionError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import nbformat
from nbformat import v4

from kernmind import __version__
from kernmind.execution.errors import SessionError
from kernmind.execution.sandbox.workspace import off_loop
from kernmind.execution.sessions import history

if TYPE_CHECKING:
    from kernmind.execution.sessions.books import Books
    from kernmind.execution.sessions.session import Session

MIME_OF = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "svg": "image/svg+xml",
    "html": "text/html",
    "json": "application/json",
    "markdown": "text/markdown",
    "latex": "text/latex",
}
COMMENT = {"javascript": "//", "typescript": "//", "java": "//", "r": "#"}


def build(entries: list[dict[str, Any]], session_id: str, python_version: str) -> nbformat.NotebookNode:
    """A validated notebook from the recorded calls (see ``history.read``)."""
    if not entries:
        raise SessionError(
            f"session {session_id!r} has no recorded calls to export yet; run some code first."
        )
    cells = [_cell(entry["code"], entry["result"]) for entry in entries]
    nb = v4.new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": python_version},
            "kernmind": {"session_id": session_id, "exported_by": f"kernmind {__version__}"},
        },
    )
    nbformat.validate(nb)
    return nb


def dumps(nb: nbformat.NotebookNode) -> bytes:
    return nbformat.writes(nb).encode()


def _cell(code: str, result: dict[str, Any]) -> nbformat.NotebookNode:
    language = str(result.get("language", "python"))
    meta = {
        "kernmind": {
            "language": language,
            "status": result.get("status"),
            "duration_ms": result.get("duration_ms"),
        }
    }
    if language == "python":
        return v4.new_code_cell(
            code, execution_count=result.get("execution_count"), outputs=_outputs(result), metadata=meta
        )
    if language == "bash":
        return v4.new_code_cell(f"%%bash\n{code}", outputs=_outputs(result), metadata=meta)
    mark = COMMENT.get(language, "#")
    meta["kernmind"]["outputs"] = _outputs(result)
    return v4.new_raw_cell(
        f"{mark} language: {language} (run with kernmind's run_code)\n{code}", metadata=meta
    )


def _outputs(result: dict[str, Any]) -> list[nbformat.NotebookNode]:
    outputs: list[nbformat.NotebookNode] = []
    logs = result.get("logs") or {}
    for name in ("stdout", "stderr"):
        text = "".join(logs.get(name) or [])
        if text:
            outputs.append(v4.new_output("stream", name=name, text=text))
    for item in result.get("results") or []:
        data = {"text/plain": item.get("text", "")}
        for field, mime in MIME_OF.items():
            if item.get(field) is not None:
                data[mime] = item[field]
        if item.get("is_main_result"):
            outputs.append(
                v4.new_output("execute_result", data=data, execution_count=result.get("execution_count"))
            )
        else:
            outputs.append(v4.new_output("display_data", data=data))
    error = result.get("error")
    if error:
        traceback = str(error.get("traceback") or f"{error.get('name')}: {error.get('value')}")
        outputs.append(
            v4.new_output(
                "error",
                ename=str(error.get("name", "Error")),
                evalue=str(error.get("value", "")),
                traceback=traceback.splitlines(),
            )
        )
    return outputs


async def export(books: Books, session: Session, python_version: str, path: str) -> tuple[str, int, int]:
    """Write ``session``'s history as a notebook at ``path`` in its working directory:
    (path, cells, bytes)."""
    home = session.home
    if home is None:
        raise SessionError(
            "export_notebook needs a stored session's history; sessions on a kernel gateway keep none."
        )
    await books.flush(session)  # the last calls' lines are written after their answers
    entries = await off_loop(lambda: history.read(home.history), timeout=None)
    nb = build(entries, session.id, python_version)
    data = dumps(nb)
    rel = await session.files().awrite(path, data)
    return rel, len(nb.cells), len(data)

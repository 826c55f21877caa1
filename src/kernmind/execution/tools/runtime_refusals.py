"""``model_errors``: an interpreter that cannot start, worded as a refusal a model can act on.

Design: every execution tool runs its call to the executor inside ``with model_errors(...)``, so
the wording lives in one place (the executor knows nothing of MCP).

Error policy: ``RuntimeUnavailable`` becomes an ``Unavailable`` refusal naming what could not
start and pointing the operator at ``kernmind doctor`` (a ``StorageError`` with the disk sentence
when a full or failing disk caused it); the error boundary answers both. The rest passes through.
"""

import contextlib
from collections.abc import Iterator

from kernmind.diskio import StorageError, disk_sentence
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.refusals import Unavailable


@contextlib.contextmanager
def model_errors(what: str = "the request") -> Iterator[None]:
    """An interpreter that cannot start, as a refusal naming ``what`` (the boundary answers it)."""
    try:
        yield
    except RuntimeUnavailable as exc:
        if (sentence := _disk_cause(exc, f"start {what}")) is not None:
            raise StorageError(sentence) from exc
        raise Unavailable(
            f"could not start {what}: {exc}. Try again; if it persists, the server's operator should "
            "run `kernmind doctor`."
        ) from exc


def _disk_cause(exc: BaseException, what: str) -> str | None:
    """The disk sentence when a full (or failing) disk is what caused ``exc``."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes, bounded
        if seen is None:
            return None
        if (sentence := disk_sentence(seen, what)) is not None:
            return sentence
        seen = seen.__cause__ or seen.__context__
    return None

"""Saving a Python session's variables when its interpreter stops, and bringing them back
(docs/architecture.md, "Variables are saved inside the sandbox"; docs/tools.md, "Sessions that last").

Design: both directions are code the session's kernel runs off the record; the server never
unpickles, it reads the one JSON line the kernel prints, checked field by field and bounded.
The file (``/run/kernmind/state/namespace.pkl`` in the kernel, moved by
``sessions/snapshot_files.py``) is written under a temporary name and renamed: one record per
variable (name, serializer, length, pickle: the C pickler first, dill when that fails or the
pickle names ``__main__``), then a trailer of module aliases re-imported by name.

Error policy: nothing here raises into a call. ``save`` returns a ``SaveReport``, or a
sentence saying why the kernel could not save (with a log line); ``restore`` returns the
notes to show, including why nothing could be restored.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kernmind.execution.kernels.api import Kernel
from kernmind.execution.results import OutputCollector, ago

log = logging.getLogger(__name__)

SNAPSHOT_DIR = ".km-state"  # inside files/: where sessions before round 4 kept their variables
SNAPSHOT_FILE = f"{SNAPSHOT_DIR}/namespace.pkl"
GRACE = 5.0  # seconds past the budget the server waits before interrupting the kernel
MAX_LISTED = 30  # names shown in a note
MAX_NAME = 200  # characters of a variable name shown
MAX_REASON = 300  # characters of a reason shown

_SAVE = r"""
def _km_save(path, limit, seconds):
    import json, os, pickle, re, struct, sys, time, types
    try:
        import dill
    except (ImportError, OSError):  # (its import opens /dev/null for writing: refused while over the quota)
        dill = None
    ip = get_ipython()
    ns, hidden = ip.user_ns, ip.user_ns_hidden
    bookkeeping = re.compile(r"^(_+|_i+|_i\d+|_\d+|_oh|_ih|_dh|In|Out|exit|quit|get_ipython|_km_.*)$")
    deadline = time.monotonic() + seconds
    saved, modules, skipped, used = [], {}, {}, 0

    class TooBig(Exception):
        pass

    class NeedsDill(Exception):
        pass

    class Capped:
        # Counts what is written; with ``watch``, refuses pickles that name __main__ (a class or
        # function defined in a cell: pickle would store a reference the next kernel lacks).
        def __init__(self, f, room, watch):
            self.f, self.room, self.watch = f, room, watch

        def write(self, data):
            self.room -= len(data)
            if self.room < 0:
                raise TooBig()
            if self.watch and b"__main__" in data:
                raise NeedsDill()
            return self.f.write(data)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(b"KMSNAP2\n")
            for name in list(ns):
                if name in hidden or bookkeeping.match(name):
                    continue
                value = ns[name]
                if isinstance(value, types.ModuleType):
                    if sys.modules.get(value.__name__) is value:
                        modules[name] = value.__name__
                    else:
                        skipped[name] = "a module that cannot be imported by name"
                    continue
                if time.monotonic() > deadline:
                    skipped[name] = "the time allowed for saving ran out"
                    continue
                start = f.tell()
                key = name.encode()
                problem = None
                # The C pickler first (fast on data); dill for what it cannot do or would only reference.
                for kind, ser in ((b"p", pickle), (b"d", dill)):
                    if ser is None:
                        break
                    f.seek(start)
                    f.truncate()
                    f.write(struct.pack("<I", len(key)) + key + kind + bytes(8))
                    body = f.tell()
                    try:
                        ser.dump(value, Capped(f, limit - used, kind == b"p"), protocol=5)
                    except TooBig:
                        problem = "too large for the space left for saved variables"
                        break
                    except NeedsDill:
                        problem = "defined in a cell, and dill is not installed"
                        continue
                    except OSError as exc:
                        if exc.errno in (5, 28, 30, 122):  # the disk failed, not the variable: keep the last snapshot
                            raise
                        problem = f"cannot be saved ({type(exc).__name__}: {str(exc)[:80]})"
                        continue
                    except Exception as exc:
                        problem = f"cannot be saved ({type(exc).__name__}: {str(exc)[:80]})"
                        continue
                    end = f.tell()
                    f.seek(body - 8)
                    f.write(struct.pack("<Q", end - body))
                    f.seek(end)
                    used += end - start
                    saved.append(name)
                    problem = None
                    break
                if problem is not None:
                    skipped[name] = problem
                    f.seek(start)
                    f.truncate()
            trailer = json.dumps(modules).encode()
            f.write(struct.pack("<I", 0) + b"m" + struct.pack("<Q", len(trailer)) + trailer)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        try:
            os.unlink(tmp)  # half a snapshot would only fill the disk
        except OSError:
            pass
        raise
    os.replace(tmp, path)
    print("\n" + json.dumps({"saved": saved, "modules": modules, "skipped": skipped, "bytes": used}))
"""

_PID = r"""
def _km_pid():
    import json, os
    print("\n" + json.dumps({"pid": os.getpid()}))
"""

_RESTORE = r"""
def _km_restore(path):
    import importlib, json, os, pickle, struct
    ns = get_ipython().user_ns
    restored, failed = [], {}
    try:
        os.unlink(path + ".tmp")  # what a save that never finished left
    except OSError:
        pass
    try:
        with open(path, "rb") as f:
            if f.readline() != b"KMSNAP2\n":
                raise ValueError("not a kernmind snapshot")
            records, modules = [], {}
            while True:
                head = f.read(4)
                if len(head) < 4:
                    break
                key = f.read(struct.unpack("<I", head)[0]).decode()
                kind = f.read(1)
                (size,) = struct.unpack("<Q", f.read(8))
                at = f.tell()
                if not key:
                    modules = json.loads(f.read(size))
                    break
                records.append((key, kind, at))
                f.seek(at + size)
            for alias, module in dict(modules).items():
                try:
                    ns[str(alias)] = importlib.import_module(str(module))
                    restored.append(str(alias))
                except Exception as exc:
                    failed[str(alias)] = f"import {module} failed ({type(exc).__name__})"
            for key, kind, at in records:
                f.seek(at)
                try:
                    ser = importlib.import_module("dill") if kind == b"d" else pickle
                    ns[key] = ser.load(f)
                    restored.append(key)
                except Exception as exc:
                    failed[key] = f"{type(exc).__name__}: {str(exc)[:80]}"
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:120]}"
        print("\n" + json.dumps({"restored": restored, "failed": failed, "error": error}))
        return
    print("\n" + json.dumps({"restored": restored, "failed": failed}))
"""


def _call(source: str, function: str, *args: object) -> str:
    """Code that defines and runs ``function`` in a private namespace (the user's stays clean)."""
    call = f"{function}({', '.join(repr(a) for a in args)})"
    program = f"{source}\n{call}\n"
    return f"exec({program!r}, {{'get_ipython': get_ipython}})"


@dataclass
class SaveReport:
    saved: list[str]
    modules: dict[str, str]
    skipped: dict[str, str]
    bytes: int
    at: float = field(default_factory=time.time)


async def _run(kernel: Kernel, code: str, seconds: float) -> dict[str, Any] | str:
    """Run snapshot code in the kernel: its report, or why there is none."""
    collector = OutputCollector(200_000)
    outcome = await kernel.execute(code, collector, deadline=time.monotonic() + seconds + GRACE, silent=True)
    if outcome.kind == "deadline":
        await kernel.interrupt(collector)
        return f"it took over {seconds:g}s"
    if outcome.kind != "ok":
        error = collector.error
        log.warning("snapshot code %s: %s", outcome.kind, error.value if error else "")
        if error is not None:
            return f"{error.name}: {error.value[:200]}"
        return "the interpreter stopped" if outcome.kind in ("died", "closed") else "it failed"
    text = "".join(collector.logs().stdout).strip()
    last = text.rsplit("\n", 1)[-1] if text else ""
    try:
        report = json.loads(last)
    except ValueError:
        return "its report was unreadable"
    return report if isinstance(report, dict) else "its report was unreadable"


async def inner_pid(kernel: Kernel) -> int | None:
    """The kernel's process id as it sees it (in its sandbox's namespace); None: no answer."""
    report = await _run(kernel, _call(_PID, "_km_pid"), 5.0)
    pid = report.get("pid") if isinstance(report, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


async def save(
    kernel: Kernel, inner_root: str, *, limit_bytes: int, seconds: float, path: str | None = None
) -> SaveReport | str:
    """Save the kernel's user namespace at ``path`` as the kernel sees it (default: in its working
    directory; a string: why it could not)."""
    path = path or f"{inner_root.rstrip('/')}/{SNAPSHOT_FILE}"
    report = await _run(kernel, _call(_SAVE, "_km_save", path, limit_bytes, seconds), seconds)
    if isinstance(report, str):
        return report
    try:
        return SaveReport(
            saved=_strings(report["saved"]),
            modules=_string_map(report["modules"]),
            skipped=_string_map(report["skipped"]),
            bytes=int(report["bytes"]),
        )
    except (KeyError, TypeError, ValueError):
        return "its report was malformed"


async def restore(
    kernel: Kernel,
    inner_root: str,
    *,
    seconds: float,
    taken_at: float | None,
    clean: bool,
    path: str | None = None,
) -> list[str]:
    """Load the snapshot at ``path`` (default: in the working directory) in the kernel; the notes
    that say what came back and what did not."""
    path = path or f"{inner_root.rstrip('/')}/{SNAPSHOT_FILE}"
    report = await _run(kernel, _call(_RESTORE, "_km_restore", path), seconds)
    age = ""
    if taken_at is not None:
        age = f" saved {ago(time.time() - taken_at)}"
    try:
        if isinstance(report, str):
            raise ValueError(report)
        restored = _strings(report.get("restored", []))
        failed = _string_map(report.get("failed", {}))
        error = report.get("error")
        if error is not None and not isinstance(error, str):
            raise TypeError("error is not a string")
    except (TypeError, ValueError, AttributeError):
        return [
            f"the session's saved variables{age} could not be restored (the restore failed, took over "
            f"{seconds:g}s or reported nonsense); it starts from a fresh interpreter, files kept."
        ]
    notes = []
    if error:
        notes.append(f"the saved variables could not be read ({error[:200]}).")
    if restored:
        where = (
            f"from a snapshot{age} (the server stopped without saving: changes after it are lost)"
            if not clean
            else f"(saved when its interpreter stopped{', ' + age.removeprefix(' saved ') if age else ''})"
        )
        notes.append(f"variables restored {where}: {_names(restored)}.")
    if failed:
        shown = "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:MAX_LISTED])
        notes.append(f"could not be restored: {shown}.")
    return notes


def _strings(value: Any, limit: int = 10_000) -> list[str]:
    """A report's list of names, checked (``TypeError`` when it is not one) and bounded."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("not a list of strings")
    return [v[:MAX_NAME] for v in value[:limit]]


def _string_map(value: Any, limit: int = 10_000) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise TypeError("not a map of strings")
    return {str(k)[:MAX_NAME]: v[:MAX_REASON] for k, v in list(value.items())[:limit]}


def skipped_note(skipped: dict[str, str]) -> str:
    """What a snapshot left out, for the call that restores it."""
    shown = "; ".join(f"{k}: {v}" for k, v in list(skipped.items())[:MAX_LISTED])
    return f"not saved when the interpreter stopped (recreate them): {shown}."


def _names(names: list[str]) -> str:
    head = ", ".join(names[:MAX_LISTED])
    return head + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")

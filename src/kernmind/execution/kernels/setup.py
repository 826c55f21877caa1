"""The code every kernel runs once, before it joins the warm pool (plain source: the kernel
cannot import kernmind; the output path: docs/architecture.md, "Runner and kernel").

Design
- No IPython output history, colours or fancy tracebacks; inline PNG figures.
- An output cap inside the kernel (``Budget.kernel_cap``): a head, then a bounded tail with a
  count of what was dropped, for every stream, fd and forked child.
- Lone surrogates leave as escapes instead of breaking ipykernel's packer.
- No blind sleep at a cell's end: each fd watcher is awaited until its pipe is empty, at most
  ``DRAIN_LIMIT``. ``%pip install`` fails naming ``install_packages``.

Error policy: a watcher whose state cannot be read gets the old sleep; a failing setup cell
fails the kernel's start.
"""

from __future__ import annotations

from kernmind.budget import Budget
from kernmind.execution.packages.guard import KERNEL_GUARD

DRAIN_LIMIT = 0.02  # seconds a cell's end waits at most for output a child wrote to fd 1/2

_TEMPLATE = """\
get_ipython()._tee = lambda channel, _null=__import__("contextlib").nullcontext: _null()
get_ipython().events.register("post_run_cell", lambda *_: get_ipython().history_manager.outputs.clear())
get_ipython().run_line_magic('colors', 'nocolor')
get_ipython().run_line_magic('xmode', 'Plain')
get_ipython().config.InlineBackend.figure_formats = {{"png"}}  # for an inline backend made later
_kernmind_inline = __import__("sys").modules.get("matplotlib_inline.config")
if _kernmind_inline is not None and _kernmind_inline.InlineBackend.initialized():
    _kernmind_inline.InlineBackend.instance().figure_formats = {{"png"}}
del _kernmind_inline


def _kernmind_prompt_io(drain_limit):
    import fcntl
    import os
    import struct
    import sys
    import termios
    import time
    from ipykernel.iostream import OutStream

    read_call = {{"x86_64": "0", "aarch64": "63", "riscv64": "63"}}.get(os.uname().machine)

    def unread(fid):
        return struct.unpack("i", fcntl.ioctl(fid, termios.FIONREAD, b"\\0\\0\\0\\0"))[0]

    def reading(thread, fid):
        # True when the watcher is blocked in read(fid): whatever it read before is written on.
        with open("/proc/self/task/%d/syscall" % thread.native_id) as f:
            fields = f.read().split()
        return len(fields) > 1 and fields[0] == read_call and int(fields[1], 16) == fid

    def drain(*_):
        deadline = time.monotonic() + drain_limit
        for stream in (sys.stdout, sys.stderr):
            fid, thread = getattr(stream, "_fid", None), getattr(stream, "watch_fd_thread", None)
            if not isinstance(stream, OutStream) or fid is None or thread is None or not thread.is_alive():
                continue
            try:
                while not (unread(fid) == 0 and reading(thread, fid)) and time.monotonic() < deadline:
                    time.sleep(0.0002)
            except (OSError, ValueError):  # no /proc, another kernel, an unknown machine
                time.sleep(0.0005)
                return

    if read_call is not None:  # else ipykernel's sleep stays
        get_ipython().kernel._execute_sleep = 0
        get_ipython().events.register("post_run_cell", drain)

    original_flush = OutStream.flush

    def flush(self):
        if not getattr(self, "_flush_pending", True) and self.echo is None and self._is_master_process():
            return None
        return original_flush(self)

    OutStream.flush = flush


_kernmind_prompt_io({drain_limit})
del _kernmind_prompt_io


def _kernmind_keep_output(keep_after, folder):
    # A cell's whole output, once it passes ``keep_after`` characters, also goes to a file per
    # stream in the session's working directory (the one the first cell starts in, held open so
    # a chdir or the directory's rename does not move it), named to the server by a marker at
    # the cell's end. Bounded by the workspace quota: a refused write ends the file there.
    import os
    import threading
    import time

    state = {{"total": 0, "early": {{}}, "files": {{}}, "chars": {{}}, "stamp": None, "why": None, "root": None}}
    lock = threading.Lock()

    def first_cell(*_):
        get_ipython().events.unregister("pre_run_cell", first_cell)
        try:
            state["root"] = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            pass

    get_ipython().events.register("pre_run_cell", first_cell)

    def forked():  # a child's prints reach the parent's streams (fd watchers): the parent keeps them
        state["why"] = "a forked process"

    os.register_at_fork(after_in_child=forked)

    def open_file(name):
        if state["root"] is None:
            state["root"] = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.mkdir(folder, 0o755, dir_fd=state["root"])
        except FileExistsError:
            pass
        where = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state["root"])
        try:
            if state["stamp"] is None:
                state["stamp"] = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            for n in range(100):
                path = "%s%s-%s.txt" % (state["stamp"], "-%d" % n if n else "", name)
                try:
                    fd = os.open(path, flags, 0o644, dir_fd=where)
                    break
                except FileExistsError:
                    continue
            else:
                raise FileExistsError("no free name for the output file")
        finally:
            os.close(where)
        state["files"][name] = (folder + "/" + path, fd)
        state["chars"][name] = 0
        return fd

    def put(fd, text):  # unbuffered: a forked child holds no copy of pending data to write twice
        data = text.encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(fd, data):]

    def keep(stream, string):
        if state["why"] is not None:
            return
        name = stream.name if stream.name in ("stdout", "stderr") else "stdout"
        with lock:
            state["total"] += len(string)
            if not state["files"] and state["total"] <= keep_after:
                state["early"].setdefault(name, []).append(string)
                return
            try:
                kept = state["files"].get(name)
                fd = kept[1] if kept else open_file(name)
                if not kept:
                    early = "".join(state["early"].pop(name, []))
                    put(fd, early)
                    state["chars"][name] += len(early)
                put(fd, string)
                state["chars"][name] += len(string)
            except (OSError, ValueError) as e:
                state["why"] = e.strerror if isinstance(e, OSError) and e.strerror else str(e)

    def finish():
        # Close this cell's files; return the markers that name them (one per stream).
        with lock:
            files, why = state["files"], state["why"]
            state.update(total=0, early={{}}, files={{}}, stamp=None, why=None)
            markers = []
            for name, (path, fd) in files.items():
                try:
                    os.close(fd)
                except OSError as e:
                    why = why or e.strerror
                cut = "; the workspace refused the rest: %s" % why if why else ""
                markers.append((name, "\\n… [kernmind kept %d characters of this %s in %s%s] …\\n" % (state["chars"][name], name, path, cut)))
            return markers

    return keep, finish


def _kernmind_cap_output(head, tail_size, interval, keep_after):
    import collections
    import contextvars
    import os
    import sys
    import threading
    from ipykernel.iostream import OutStream

    original = OutStream.write
    state = {{"used": 0, "dropped": 0, "tail_len": 0, "timer": None, "cell": 0}}
    tail = collections.deque()
    locks = {{"state": threading.Lock(), "send": threading.Lock()}}
    keep_whole, kept_files = _kernmind_keep_output(keep_after, "kernmind-output") if keep_after else (None, None)

    def write(self, string):
        if not isinstance(string, str):
            return original(self, string)
        if keep_whole is not None:
            keep_whole(self, string)
        n = len(string)
        start = 0
        room = head - state["used"]
        if room > 0:
            part = string[:room]
            state["used"] += len(part)
            original(self, part)
            start = len(part)
        if start < n:
            # Past the head: keep at most a tail's worth, without copying the rest, and send it
            # within ``interval`` seconds (a running job's latest lines; see ``flush``).
            keep = string[max(start, n - tail_size):]
            with locks["state"]:
                state["dropped"] += n - start
                tail.append([self, keep])
                state["tail_len"] += len(keep)
                while state["tail_len"] > tail_size:
                    excess = state["tail_len"] - tail_size
                    if len(tail[0][1]) <= excess:
                        state["tail_len"] -= len(tail.popleft()[1])
                    else:
                        tail[0][1] = tail[0][1][excess:]
                        state["tail_len"] -= excess
                if state["timer"] is None:  # in this context: the stream's parent is this cell's
                    run = contextvars.copy_context().run
                    timer = threading.Timer(interval, run, (flush, state["cell"]))
                    timer.daemon = True
                    timer.name = "kernmind-output-tail"
                    state["timer"] = timer
                    timer.start()
        return n

    def take():
        # What the tail holds, and how much was dropped before it; both handed over (the lock held).
        items, unsent = list(tail), state["dropped"] - state["tail_len"]
        tail.clear()
        state.update(dropped=0, tail_len=0)
        return unsent, items

    def flush(cell=None):
        # A timer's (``cell``: the output it was started for) or the cell's end (None). Sends are
        # serialised, so the server gets the tails in the order they were taken.
        with locks["send"]:
            with locks["state"]:
                if cell is not None and cell != state["cell"]:
                    return  # a timer of output since cleared or ended, which fired late
                timer, state["timer"] = state["timer"], None
                if cell is None and timer is not None:
                    timer.cancel()
                unsent, items = take()
            if items:
                original(items[0][0], "\\n… [kernel dropped %d characters of output] …\\n" % unsent)
            for target, text in items:
                original(target, text)

    def reset(*_):
        with locks["state"]:
            timer, state["timer"] = state["timer"], None
            if timer is not None:
                timer.cancel()
            take()
            state["used"] = 0
            state["cell"] += 1
        # IPython's output tee (turned off above, but active while this setup cell ran) leaves
        # the original bound write on the stream objects, which would bypass the cap.
        import sys
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, OutStream):
                stream.__dict__.pop("write", None)

    def finish(*_):
        flush()
        if kept_files is not None:
            for name, marker in kept_files():
                original(sys.stdout if name == "stdout" else sys.stderr, marker)
        reset()

    def forked():  # a lock held by the parent's timer at the fork would stay held in the child
        locks.update(state=threading.Lock(), send=threading.Lock())
        state["timer"] = None

    os.register_at_fork(after_in_child=forked)
    OutStream.write = write
    events = get_ipython().events
    events.register("pre_run_cell", reset)
    events.register("post_run_cell", finish)

    # clear_output() gives the cleared output's share of the cap back (the server does the same).
    display_pub = get_ipython().display_pub
    clear = display_pub.clear_output

    def clear_output(wait=False):
        clear(wait)
        reset()

    display_pub.clear_output = clear_output


_kernmind_cap_output({head}, {tail}, {interval}, {keep_after})
del _kernmind_cap_output, _kernmind_keep_output


def _kernmind_safe_pack(session):
    packer = session.pack

    def text(value):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
        out = []
        for ch in value:
            code = ord(ch)
            if 0xDC80 <= code <= 0xDCFF:
                out.append("\\\\x%02x" % (code - 0xDC00))
            elif 0xD800 <= code <= 0xDFFF:
                out.append("\\\\u%04x" % code)
            else:
                out.append(ch)
        return "".join(out)

    def clean(value):
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {{clean(k): clean(v) for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    def pack(obj):
        try:
            data = packer(obj)
            data.decode("utf-8")  # surrogateescape lets a lone byte through: not valid UTF-8
            return data
        except (UnicodeEncodeError, UnicodeDecodeError):
            return packer(clean(obj))

    session.pack = pack


_kernmind_safe_pack(get_ipython().kernel.session)
del _kernmind_safe_pack
"""


def setup_code(budget: Budget, *, keep_output: bool = True) -> str:
    """The setup cell for answers of ``budget`` (cap ``budget.kernel_cap()``); with ``keep_output``, output
    past ``budget.keep_after()`` also goes whole to a file (``results.KEPT_RE``)."""
    cap = budget.kernel_cap()
    keep_after = budget.keep_after() if keep_output else 0
    return (
        _TEMPLATE.format(
            head=cap.head,
            tail=cap.tail,
            interval=cap.interval,
            keep_after=keep_after,
            drain_limit=DRAIN_LIMIT,
        )
        + KERNEL_GUARD
    )

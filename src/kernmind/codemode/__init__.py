"""Code mode: code running in a Python session calls kernmind's memory tools as functions.

    import kernmind_tools as km
    km.archival_memory_insert(content="…", tags=["finding"])

The room, in the order a call travels:

- ``client/kernmind_tools.py`` runs inside the sandbox (standard library only): one function
  per allowed tool, ``call(name, **arguments)``, ``ToolError``.
- ``kernels.py``: ``CodeMode``, the ``KernelExtras`` the executor calls (mounts the client,
  sets ``PYTHONPATH`` and ``KERNMIND_TOOLS_SOCKET``, opens a channel when a kernel joins a session).
- ``channel.py``: the per-kernel Unix socket (only the kernel's own uid may connect), one JSON
  line per request.
- ``dispatch.py``: the memory tools only; each call runs the registered tool as the session's
  principal, through the same argument checks and hooks as a client's call.

``server.py`` wires it: ``execution`` and ``memory`` never import each other or this room.
"""

from kernmind.codemode.dispatch import ToolDispatch
from kernmind.codemode.kernels import CodeMode

__all__ = ["CodeMode", "ToolDispatch"]

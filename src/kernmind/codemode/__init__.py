"""Code mode: code running in a Python session calls kernmind's memory tools as functions
(docs/code-mode.md).

A call travels: ``client/kernmind_tools.py`` (inside the sandbox, standard library only) →
``channel.py`` (the kernel's Unix socket) → ``dispatch.py`` (memory tools only, run as the
session's principal through a client's checks); ``kernels.py`` adds the client and the channel to
every kernel. server.py wires it: ``execution`` and ``memory`` never import this room.
"""

from kernmind.codemode.dispatch import ToolDispatch
from kernmind.codemode.kernels import CodeMode

__all__ = ["CodeMode", "ToolDispatch"]

"""Code mode: code running in a Python session calls kernmind's memory tools as functions
(docs/code-mode.md; the path of a call is in docs/architecture.md, "A call from code").

server.py wires it: ``execution`` and ``memory`` never import this room.
"""

from kernmind.codemode.dispatch import ToolDispatch
from kernmind.codemode.kernels import CodeMode

__all__ = ["CodeMode", "ToolDispatch"]

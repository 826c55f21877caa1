"""kernmind: an MCP server that gives AI agents a sandboxed place to run code and a memory that lasts."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kernmind")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]

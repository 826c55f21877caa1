"""Bounds on the free-text tool arguments that drive work in the server itself.

A tool's work in the sandbox is bounded by the sandbox; what the *server* does with an
argument is bounded here. Unbounded, one principal could slow every other down with one
call: a 10 MB glob pattern or search query kept the server's CPU busy for as long as a
client cares to wait (``fnmatch``; tokenizing and ranking). Each bound is far above any real use
(a glob pattern of 1,000 characters, a query of 10,000, a path of 4,096 bytes as Linux
allows), goes into the tool's input schema (``maxLength``/``maxItems``, so clients see it), and a
longer value is refused by argument validation, before any work, with a sentence that
names the argument, its limit and the length given (``tool_arguments.py``).
"""

from __future__ import annotations

PATTERN_CHARS = 1_000  # list_files' glob pattern
QUERY_CHARS = 10_000  # archival_memory_search and conversation_search queries
PATH_CHARS = 4_096  # a path in a session's working directory (PATH_MAX)
MEMORY_PATH_CHARS = 1_000  # a /memories path of the memory tool (a label is at most 200)
DATE_CHARS = 64  # an ISO 8601 date or datetime
TAGS = 50  # tags on one passage, or in one search
THREAD_CHARS = 200  # a passage's thread label (archival_memory_insert/search)
LANGUAGE_CHARS = 40
DESCRIPTION_CHARS = 2_000  # a memory block's description (shown with every listing and prompt)

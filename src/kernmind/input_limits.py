"""Bounds on the free-text tool arguments that drive work in the server itself (a 10 MB glob
pattern or query would keep the CPU busy for everyone): far above real use, in the input schema,
refused before any work (tool_arguments.py).
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

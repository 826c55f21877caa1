"""Memory: Letta-style blocks and archival passages in SQLite, safe under concurrency and crashes.

Modules:
    store       SQLite schema, migrations, transactions (WAL, busy timeout, BEGIN IMMEDIATE);
                blocks with versions and history; passages with FTS5 bm25 search and filters.
    blocks      result models of the block tools and the ``<memory_blocks>`` prompt layout.
    archival    insert/search/delete of passages; hybrid ranking (RRF) when embeddings exist.
    embeddings  OpenAI-compatible embedding client (with a circuit breaker) and a numpy index.
    tools       the MCP surface: tools, ``memory://blocks`` resources, the ``memory`` prompt.
    cli         ``kernmind memory export|import``.

Error policy everywhere: what a caller can fix is a ``MemoryRefusal`` (a ``ToolError`` at the
MCP layer) whose message says what to do instead, and a refused write changes nothing.
"""

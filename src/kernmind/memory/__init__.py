"""Memory: Letta-style blocks and archival passages, safe under concurrency and crashes.

The domain (no MCP in it):
    errors       MemoryRefusal: a refusal in domain words that each surface renders in its own.
    records      the rows every layer passes around (blocks, history, passages) and time helpers.
    blocks       the rules of blocks: labels, limits, read-only, versions, and the edits themselves.
    block_store  blocks of one namespace in a transaction: versions, history, undo, seeding.
    passages     archival passages of one namespace: storing, deleting, tags, vector bookkeeping.
    fulltext     how text becomes search terms (word forms; CJK/Thai character bigrams).
    archival     search: full text alone, or fused with vectors (RRF); embedding on insert.
    embeddings   embedders (OpenAI-compatible) and the in-memory vector index.
    transfer     export/import of a namespace as JSON.
    store        MemoryStore: one namespace in one database (opens it, hands out the parts).
The database:
    database     what the stores need from a backend (Tx, transactions, full-text search).
    sqlite       the SQLite backend: connection, WAL, busy retries, schema migrations.
    fts5         full-text search on SQLite FTS5 (bm25, filters before paging).
The surfaces:
    tools        the MCP surface: tools, ``memory://blocks`` resources, the ``memory`` prompt.
    block_results  what the block tools return, and the ``<memory_blocks>`` prompt layout.
    cli          ``kernmind memory export|import``.

Error policy everywhere: what a caller can fix is a ``MemoryRefusal`` (a ``ToolError`` at the
MCP layer) whose message says what to do instead, and a refused write changes nothing.
"""

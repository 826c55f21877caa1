"""Memory: Letta-style blocks and archival passages, safe under concurrency and crashes.

The domain (no MCP in it):
    errors       MemoryRefusal: a refusal in domain words that each surface renders in its own (refusals()).
    records      the rows every layer passes around (blocks, history, passages, messages, stored
                 vectors and the filters on them; the message SQL shapes) and time helpers.
    blocks       the rules of blocks: labels, limits, read-only, versions, and the edits themselves.
    block_store  blocks of one namespace in a transaction: versions, history, undo, seeding.
    passages     archival passages of one namespace: storing, deleting, tags, times, exact
                 duplicates, superseding (chains, undo by delete), vector bookkeeping.
    fulltext     how text becomes search terms (word forms; CJK/Thai character bigrams).
    archival     archival passages: store (embedding, near-duplicate notes), search, delete.
    embeddings   the embedder interface, the static model, the OpenAI-compatible client.
    embedder_factory  which embedder ``--embedding-model`` names (imports minilm and embeddings).
    minilm       the default model: all-MiniLM-L6-v2 as an int8 ONNX graph, offline, files checked.
    vector_index the in-memory vector index: its columns, filters in memory, coherent with writers.
    vector_scores  scoring a snapshot of the index: exact nearest, neighbours, the near-duplicate shortlist.
    texts        what searchable tables share: counting texts, keeping their vectors, change counters.
    recall       hybrid search for any corpus (full text + vectors), background backfill.
    replaced     a superseded passage's match passed to the passage that replaced it.
    fusion       how the two rankings become one score in [0, 1]: normalised scores, neighbours, thread prior, cut-off.
    conversations  recorded conversations: messages and their search.
    recorder     the bundled agent's recorder of its conversation (the agent's one way in).
    transfer     export/import of a namespace as JSON (blocks, passages, conversations).
    legacy_owner the upgrade that moves the --token principal's earlier namespace (default/<agent>) in.
    store        MemoryStore: one namespace in one database (opens it, hands out the parts).
The database:
    database     what the stores need from a backend (Tx, transactions, full-text search).
    sqlite       the SQLite backend: connection, WAL, busy retries, running the migrations.
    sqlite_schema  the SQLite schema: its versioned migrations (SQL, then a Python step).
    fts5         full-text search on SQLite FTS5 (bm25, filters before paging), for any table.
The surfaces:
    tools        the MCP surface: lifecycle, ``memory://blocks`` resources, the ``memory`` prompt.
    block_tools  the ``memory_*`` tools and the ``memory`` tool (Anthropic's dialect).
    memory_tool  the ``/memories`` dialect over blocks: paths, folders, that tool's results.
    archival_tools  ``archival_memory_*`` and ``conversation_search``.
    block_results  what the block tools return, and the ``<memory_blocks>`` prompt layout.
    cli          ``kernmind memory show|search|export|import``.

Error policy everywhere: what a caller can fix is a ``MemoryRefusal`` (a ``Refusal``, answered
by ``boundary.py``) whose message says what to do instead, and a refused write changes nothing.
"""

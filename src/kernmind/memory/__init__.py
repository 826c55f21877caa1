"""Memory: Letta-style blocks and archival passages in SQLite (see memory/tools.py)."""

"""Recording the bundled agent's conversation into memory: the agent's one way into ``memory``.

Design: :class:`ConversationRecorder` opens the namespace's store beside the server (the same
database; concurrent writers are safe) and records each message, with its vector, as it is appended.
Error policy: best effort: a failure is logged and the agent goes on; it never raises into the agent.
"""

from __future__ import annotations

import logging
from typing import Any

from kernmind.config import Settings
from kernmind.memory.conversations import message_text
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.recall import Recall
from kernmind.memory.store import MemoryStore

log = logging.getLogger(__name__)


class ConversationRecorder:
    """Records one agent's conversation into its namespace (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: MemoryStore | None = None
        self._recall: Recall | None = None
        self.conversation_id: str | None = None

    async def start(self) -> None:
        try:
            store = await MemoryStore.from_settings(self.settings).open()
        except Exception as exc:  # recording is best effort
            log.warning("conversations will not be recorded: %s", exc)
            return
        self._store = store
        self._recall = Recall(store.conversations, make_embedder(self.settings), what="messages")
        self.conversation_id = await store.conversations.start()

    async def record(self, message: dict[str, Any]) -> None:
        if self._store is None or self.conversation_id is None:
            return
        try:
            text = message_text(message)
            vector = await self._recall.vector_for(text) if text and self._recall else None
            meta = {k: message[k] for k in ("tool_call_id", "tool_calls", "name") if message.get(k)}
            await self._store.conversations.add(
                self.conversation_id,
                str(message.get("role", "user")),
                text,
                meta=meta or None,
                embedding=vector.blob if vector else None,
                embedding_model=vector.model if vector else None,
            )
        except Exception as exc:
            log.warning("could not record a %s message: %s", message.get("role"), exc)

    async def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            if self._recall is not None and self._recall.embedder is not None:
                await self._recall.embedder.aclose()
            await store.close()

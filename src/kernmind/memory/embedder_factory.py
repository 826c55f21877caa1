"""Which embedder ``--embedding-model`` names: a local model, none, or an endpoint's model.

Apart from embeddings.py (the interface and the small embedders) because the default model
(minilm.py) builds on that interface: the choice imports both, neither imports the choice.
"""

from __future__ import annotations

from kernmind.config import Settings
from kernmind.memory.embeddings import Embedder, OpenAIEmbedder, StaticEmbedder
from kernmind.memory.minilm import MiniLMEmbedder


def make_embedder(settings: Settings) -> Embedder | None:
    """The embedder ``--embedding-model`` asks for: a local model, none, or an endpoint's model."""
    name = settings.embedding_model.strip()
    if name.lower() == "none":
        return None
    if name.lower() == "static":
        return StaticEmbedder()
    if name.lower() in ("local", "minilm"):
        return MiniLMEmbedder()
    return OpenAIEmbedder(name, settings.embedding_base_url, settings.embedding_api_key)

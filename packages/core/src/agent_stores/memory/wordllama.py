"""WordLlama as a Pydantic AI embedding model: recall by meaning with no network and no key.

`WordLlama <https://github.com/dleemiller/WordLlama>`_ (MIT) ships its 256-dimension
model and tokenizer inside its wheel and embeds on the CPU in microseconds per text, so
the demo, the tests and the recall benchmark run offline. It is a small static-embedding
model: good enough to find "daughter" from "family members", well below a provider's
model in quality. Installed by the ``wordllama`` extra
(``pip install "agent-stores[wordllama]"``)::

    SearchConfig(mode="hybrid", embedder=WordLlamaEmbeddingModel())
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult
from pydantic_ai.embeddings.result import EmbedInputType
from pydantic_ai.embeddings.settings import EmbeddingSettings

#: Texts embedded on the event loop's thread; a larger batch (a reindex) goes to a worker
#: thread so it does not stall other tasks.
INLINE_TEXTS = 32


class WordLlamaEmbeddingModel(EmbeddingModel):
    """WordLlama's model that ships in its package, loaded from there (never downloaded).

    Args:
        config: the WordLlama model configuration (the wheel holds ``l2_supercat``).
        dimensions: 256 (the shipped weights), or fewer (Matryoshka truncation).
    """

    def __init__(
        self,
        config: str = "l2_supercat",
        dimensions: int = 256,
        *,
        settings: EmbeddingSettings | None = None,
    ) -> None:
        try:
            import wordllama  # type: ignore[import-untyped]
        except ImportError as exc:
            raise ImportError(
                "WordLlamaEmbeddingModel needs WordLlama: pip install 'agent-stores[wordllama]'"
            ) from exc
        super().__init__(settings=settings)
        self._config = config
        self._dimensions = dimensions
        folder = Path(wordllama.__file__).parent
        self._model: Any = wordllama.WordLlama.load(
            config=config,
            cache_dir=folder,
            dim=256,
            trunc_dim=dimensions if dimensions != 256 else None,
            disable_download=True,
        )

    @property
    def model_name(self) -> str:
        return f"{self._config}_{self._dimensions}"

    @property
    def system(self) -> str:
        return "wordllama"

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        if len(texts) <= INLINE_TEXTS:
            vectors = self._model.embed(texts, norm=True)
        else:
            vectors = await asyncio.to_thread(self._model.embed, texts, norm=True)
        return EmbeddingResult(
            vectors.tolist(),
            inputs=texts,
            input_type=input_type,
            model_name=self.model_name,
            provider_name="wordllama",
        )

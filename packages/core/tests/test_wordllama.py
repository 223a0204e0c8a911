"""The offline WordLlama embedding model: real vectors from the weights in its wheel."""

from __future__ import annotations

import numpy as np
from agent_stores.memory.wordllama import WordLlamaEmbeddingModel
from pydantic_ai import Embedder


async def test_embeds_offline_with_the_shipped_weights() -> None:
    model = WordLlamaEmbeddingModel()
    assert (model.system, model.model_name) == ("wordllama", "l2_supercat_256")
    result = await Embedder(model).embed_documents(
        ["The user's daughter is called Maya.", "Spicy ramen for dinner.", "family members"]
    )
    vectors = np.asarray(result.embeddings)
    assert vectors.shape == (3, 256)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    daughter, ramen, family = vectors
    assert family @ daughter > family @ ramen + 0.1


async def test_truncated_dimensions_and_large_batches() -> None:
    model = WordLlamaEmbeddingModel(dimensions=64)
    assert model.model_name == "l2_supercat_64"
    result = await model.embed([f"text {i}" for i in range(100)], input_type="document")
    assert np.asarray(result.embeddings).shape == (100, 64)

"""A deterministic embedding model for the semantic contract: words mapped to concepts.

Each dimension is a concept (family, food, travel, ...); a text's vector counts the words
of each concept it contains, so rankings and cosine similarities can be worked out by
hand and asserted exactly, and two texts that share no word still meet when their
words share a concept ("daughter" and "family members").

It is a real ``pydantic_ai.embeddings.EmbeddingModel``, used through Pydantic AI's
``Embedder`` exactly as a provider's model is, and it counts what it was asked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult
from pydantic_ai.embeddings.result import EmbedInputType
from pydantic_ai.embeddings.settings import EmbeddingSettings

#: The concepts, one dimension each, and the words that stand for them.
CONCEPTS: dict[str, frozenset[str]] = {
    "family": frozenset(
        [
            "family",
            "daughter",
            "son",
            "wife",
            "husband",
            "mother",
            "father",
            "sister",
            "brother",
            "children",
            "kids",
            "parents",
            "maya",
            "grandmother",
        ]
    ),
    "food": frozenset(
        [
            "food",
            "ramen",
            "spicy",
            "eat",
            "eats",
            "dinner",
            "lunch",
            "cooking",
            "noodles",
            "vegetarian",
            "dishes",
            "meal",
        ]
    ),
    "travel": frozenset(
        ["travel", "trip", "flight", "japan", "tokyo", "hotel", "vacation", "holiday", "airport"]
    ),
    "work": frozenset(
        ["work", "job", "meeting", "office", "deadline", "manager", "project", "colleagues"]
    ),
    "pets": frozenset(["pets", "pet", "dog", "cat", "puppy", "walks"]),
    "health": frozenset(
        ["health", "allergy", "allergies", "allergic", "peanuts", "doctor", "medicine"]
    ),
    "music": frozenset(["music", "guitar", "piano", "concert", "song"]),
}
_CONCEPT_OF = {word: i for i, words in enumerate(CONCEPTS.values()) for word in words}
_WORD = re.compile(r"[a-z]+")


class EmbedderDown(ConnectionError):
    """What a :class:`ConceptEmbeddingModel` with ``down=True`` raises."""


class ConceptEmbeddingModel(EmbeddingModel):
    """Vectors of concept counts, ``dimensions`` long (the concepts first, then zeros).

    Args:
        name: the model name (two names are two models to a store).
        dimensions: the vector length, at least the number of concepts.
        down: every call fails with :class:`EmbedderDown` (an outage); settable later.
    """

    def __init__(self, name: str = "concepts", *, dimensions: int = 8, down: bool = False) -> None:
        if dimensions < len(CONCEPTS):
            raise ValueError(f"dimensions must be >= {len(CONCEPTS)}")
        super().__init__()
        self._name = name
        self.dimensions = dimensions
        self.down = down
        #: embedding requests received
        self.calls = 0
        #: texts embedded as documents, and as queries
        self.documents: list[str] = []
        self.queries: list[str] = []

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def system(self) -> str:
        return "contract"

    def vector(self, text: str) -> list[float]:
        """The vector of ``text`` (before the store normalizes it)."""
        vector = [0.0] * self.dimensions
        for word in _WORD.findall(text.lower()):
            concept = _CONCEPT_OF.get(word)
            if concept is not None:
                vector[concept] += 1.0
        return vector

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        self.calls += 1
        if self.down:
            raise EmbedderDown("the embedding service is unavailable")
        (self.documents if input_type == "document" else self.queries).extend(texts)
        return EmbeddingResult(
            [self.vector(text) for text in texts],
            inputs=texts,
            input_type=input_type,
            model_name=self._name,
            provider_name="contract",
        )

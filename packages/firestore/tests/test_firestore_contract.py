"""The shared contract suite on Google's Firestore emulator, nothing skipped or overridden.

``nox -s contract -- firestore`` runs the same suite through the URL; this module lets
``pytest packages/firestore/tests`` run it too (``nox -s tests`` leaves it out).
"""

from __future__ import annotations

import pytest
from agent_stores_contract import (
    CheckpointerContract,
    ConversationContract,
    FaultContract,
    KVContract,
    MemoryContract,
    PortContract,
    SessionContract,
)
from firestore_test_support import with_fresh_prefix


class FirestoreURL:
    """Runs a contract class on the emulator under a fresh prefix per test."""

    @pytest.fixture
    def store_url(self, firestore_base_url: str) -> str:
        return with_fresh_prefix(firestore_base_url)


class TestFirestoreKV(FirestoreURL, KVContract):
    """The KV CAS contract on Firestore."""


class TestFirestoreSessions(FirestoreURL, SessionContract):
    """The session contract on Firestore (generic KV-built store)."""


class TestFirestoreMemory(FirestoreURL, MemoryContract):
    """The memory contract on Firestore."""


class TestFirestoreCheckpointer(FirestoreURL, CheckpointerContract):
    """The checkpointer contract on Firestore."""


class TestFirestoreFaults(FirestoreURL, FaultContract):
    """The fault contract on Firestore (its gRPC fault injector, the contract's TCP proxy)."""


class TestFirestorePorts(FirestoreURL, PortContract):
    """The port contract on Firestore (the generic ports, as it offers no native ones)."""


class TestFirestoreConversations(FirestoreURL, ConversationContract):
    """Pydantic AI's ConversationStore protocol on Firestore (``open_conversations(url)``)."""

"""Requests per store operation on Firestore, counted at a gRPC interceptor: each operation
sends exactly the requests docs/requests.md lists for it (the physical minimum, or more
with the reason given there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores_contract.request_counts import RequestBudgetTests


class TestFirestoreRequestBudget(RequestBudgetTests):
    backend = "firestore"
    page = Path(__file__).resolve().parents[3] / "docs" / "requests.md"
    budget = {
        "turn, warm (this client wrote last)": 2,
        "turn, cold (another client wrote last)": 3,
        "memory write with receipt": 1,
        "memory read": 1,
        "step append (harness step store)": 1,
        "journal append (checkpointer)": 1,
    }

    @pytest.fixture
    def store_url(self, firestore_url: str) -> str:
        return firestore_url

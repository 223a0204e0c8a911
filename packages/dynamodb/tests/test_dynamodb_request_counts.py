"""Requests per store operation on DynamoDB, counted at botocore's before-send hook: each operation
sends exactly the requests docs/requests.md lists for it (the physical minimum, or more
with the reason given there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores_contract.request_counts import RequestBudgetTests


class TestDynamoDBRequestBudget(RequestBudgetTests):
    backend = "dynamodb"
    page = Path(__file__).resolve().parents[3] / "docs" / "requests.md"
    budget = {
        "turn, warm (this client wrote last)": 2,
        "turn, cold (another client wrote last)": 3,
        "memory write with receipt": 1,
        "memory read": 1,
        "step append (harness step store)": 2,
        "journal append (checkpointer)": 2,
    }

    @pytest.fixture
    def store_url(self, dynamodb_url: str) -> str:
        return dynamodb_url

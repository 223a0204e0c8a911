"""Requests per store operation on Firestore, counted at a gRPC interceptor.

Each operation sends exactly the requests docs/requests.md lists for it (the physical
minimum, or more with the reason given there): a change that adds a request fails here,
and one that saves a request updates the budget and the docs together.
"""

from __future__ import annotations

from pathlib import Path

from agent_stores_contract.request_counts import OPERATIONS, documented_totals, measure

PAGE = Path(__file__).resolve().parents[3] / "docs" / "requests.md"

BUDGET = {
    "turn, warm (this client wrote last)": 3,
    "turn, cold (another client wrote last)": 3,
    "memory write with receipt": 4,
    "memory read": 1,
    "step append (harness step store)": 1,
    "journal append (checkpointer)": 1,
}


async def test_each_operation_sends_its_budgeted_requests(firestore_url: str) -> None:
    counted = await measure(firestore_url)
    assert set(BUDGET) == set(OPERATIONS)
    totals = {operation: sum(requests.values()) for operation, requests in counted.items()}
    assert totals == BUDGET, counted


def test_the_docs_list_these_budgets() -> None:
    assert documented_totals(PAGE.read_text(), "firestore") == BUDGET

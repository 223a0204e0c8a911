"""``agent-stores copy`` from SQLite (4 MB per entry) into DynamoDB (400 KB per item).

4 MB records of every store (a session history, a memory file, a journal entry) are
re-chunked to DynamoDB's limit on the way, ``--verify`` finds both sides equal, and the
stores read them back on the moto server.
"""

from __future__ import annotations

from pathlib import Path

from agent_stores_contract.copying import copy_4mb_records_from_sqlite


def test_copy_4mb_records_from_sqlite_into_dynamodb(tmp_path: Path, dynamodb_url: str) -> None:
    copy_4mb_records_from_sqlite(tmp_path, dynamodb_url, min_parts=10)

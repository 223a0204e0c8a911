"""``agent-stores copy`` from SQLite (4 MB per entry) into Firestore (about 1 MiB per document).

4 MB records of every store (a session history, a memory file, a journal entry) are
re-chunked to the Firestore limit on the way, ``--verify`` finds both sides equal, and the
stores read them back on the Firestore emulator.
"""

from __future__ import annotations

from pathlib import Path

from agent_stores_contract.copying import copy_4mb_records_from_sqlite


def test_copy_4mb_records_from_sqlite_into_firestore(tmp_path: Path, firestore_url: str) -> None:
    copy_4mb_records_from_sqlite(tmp_path, firestore_url, min_parts=4)

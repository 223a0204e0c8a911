"""The native memory port on DynamoDB: a memory write in one TransactWriteItems.

:class:`DynamoDBMemoryPort` implements :class:`~agent_stores.memory.port.MemoryPort` with
``atomic = True``: the receipt index entry (created only if absent), the file record's
conditional Put and the directory markers of the file's path (an Update that creates a
marker when absent and changes nothing when present) commit together or not at all, in
one request, across their scopes. The store, seeing an atomic port, writes without
reading first when it can predict the record's version, so a memory write with its
receipt is one request where the generic path sends four (two reads, two writes).

A failed condition (the operation already indexed, or the record changed) writes
nothing and raises :class:`~agent_stores.errors.ConflictError`; the store then reads and
answers the replay or the conflict. The items are the ones every
:class:`~agent_stores_dynamodb.kv.DynamoDBKV` primitive reads, so the generic and the
native path share data. A transactional write costs twice the write units of plain
ones (docs/dynamodb.md, "Cost per operation").
"""

from __future__ import annotations

from agent_stores.backend import TransactMemoryPort

from .kv import DynamoDBKV


class DynamoDBMemoryPort(TransactMemoryPort):
    """:class:`~agent_stores.memory.port.TransactMemoryPort` on :class:`DynamoDBKV`: one
    TransactWriteItems a write (see the module doc)."""

    def __init__(self, kv: DynamoDBKV) -> None:
        if not isinstance(kv, DynamoDBKV):
            raise TypeError(f"DynamoDBMemoryPort needs a DynamoDBKV, got {type(kv).__name__}")
        super().__init__(kv)

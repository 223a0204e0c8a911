"""The core's own plugin: registers ``memory://`` and ``sqlite://`` like any third party."""

from __future__ import annotations

from ..hookspecs import RegisterBackend, hookimpl


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register the embedded backends."""
    register(
        "memory",
        "agent_stores.backends.memory:MemoryKV.from_url",
        description="process-local store (tests, single process)",
    )
    register(
        "sqlite",
        "agent_stores.backends.sqlite:SQLiteKV.from_url",
        description="embedded SQLite file (WAL), safe across processes",
    )

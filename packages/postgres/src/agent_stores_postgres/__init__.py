"""agent-stores-postgres: the ``postgresql://`` / ``postgres://`` backend of agent-stores.

Install it next to ``agent-stores`` and open a URL::

    from agent_stores import open_sessions
    sessions = open_sessions("postgresql://app@db.internal/agents?schema=agents")

The names below are imported lazily so that loading the plugin (done by every
``agent-stores`` process) never imports psycopg.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import PostgresConfig
    from .kv import PostgresKV
    from .schema import MIGRATIONS, SCHEMA_VERSION, Migration, SchemaVersionError, setup_schema

_LAZY = {
    "PostgresKV": "agent_stores_postgres.kv",
    "PostgresConfig": "agent_stores_postgres.config",
    "MIGRATIONS": "agent_stores_postgres.schema",
    "SCHEMA_VERSION": "agent_stores_postgres.schema",
    "Migration": "agent_stores_postgres.schema",
    "SchemaVersionError": "agent_stores_postgres.schema",
    "setup_schema": "agent_stores_postgres.schema",
}

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "PostgresConfig",
    "PostgresKV",
    "SchemaVersionError",
    "setup_schema",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)

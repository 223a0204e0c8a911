"""Stores built directly from a KV store get the backend's native ports, checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores import ConfigError, open_kv, open_sessions
from agent_stores.backend import GENERIC_ONLY, NativePorts
from agent_stores.backends.memory import MemoryKV
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.backends.sqlite_ports import (
    SQLiteJournalPort,
    SQLiteMemoryPort,
    SQLiteSessionPort,
)
from agent_stores.checkpointer import Checkpointer
from agent_stores.checkpointer.port import KVJournalPort
from agent_stores.hookspecs import hookimpl
from agent_stores.memory import KVMemoryStore
from agent_stores.memory.port import KVMemoryPort
from agent_stores.plugins import load_registry, reset_registry
from agent_stores.sessions import KVSessionPort, SessionStore


async def test_direct_constructors_get_the_sqlite_ports(tmp_path: Path) -> None:
    async with open_kv(f"sqlite:///{tmp_path}/direct.db") as kv:
        assert isinstance(SessionStore(kv).storage.port, SQLiteSessionPort)
        assert isinstance(KVMemoryStore(kv).port, SQLiteMemoryPort)
        assert isinstance(Checkpointer(kv).space.port, SQLiteJournalPort)
        # the same as through open_sessions
        sessions = open_sessions(kv)
        assert isinstance(sessions.storage.port, SQLiteSessionPort)


async def test_a_kv_store_constructed_directly_resolves_its_ports_once(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "constructed.db")
    try:
        ports = kv.ports
        assert isinstance(ports.session, SQLiteSessionPort)
        assert kv.ports is ports  # once per KV store, then read
        assert SessionStore(kv).storage.port is ports.session
        assert KVMemoryStore(kv).port is ports.memory
    finally:
        await kv.aclose()


async def test_ports_set_by_the_user_are_what_every_store_uses(tmp_path: Path) -> None:
    async with open_kv(f"sqlite:///{tmp_path}/replaced.db") as kv:
        assert isinstance(kv.ports.session, SQLiteSessionPort)  # resolved at open
        journal = KVJournalPort()
        kv.ports = NativePorts(journal=journal)
        assert isinstance(SessionStore(kv).storage.port, KVSessionPort)
        assert isinstance(KVMemoryStore(kv).port, KVMemoryPort)
        assert Checkpointer(kv).space.port is journal
        kv.ports = GENERIC_ONLY
        assert isinstance(Checkpointer(kv).space.port, KVJournalPort)
        assert Checkpointer(kv).space.port is not journal


def test_memory_kv_keeps_the_generic_ports() -> None:
    kv = MemoryKV()
    assert isinstance(SessionStore(kv).storage.port, KVSessionPort)
    assert isinstance(KVMemoryStore(kv).port, KVMemoryPort)
    assert isinstance(Checkpointer(kv).space.port, KVJournalPort)


def test_an_explicit_port_asks_no_plugin() -> None:
    kv = MemoryKV()
    port = KVSessionPort(kv)
    assert SessionStore(kv, port=port).storage.port is port


def test_a_hook_returning_something_else_is_a_config_error() -> None:
    class Wrong:
        @hookimpl
        def session_port(self, kv: object) -> object:
            return "not a port"

    reset_registry(load_registry(strict=True, disabled=set(), extra_plugins=[("wrong", Wrong())]))
    try:
        with pytest.raises(ConfigError, match="session_port hook returned str"):
            SessionStore(MemoryKV())
    finally:
        reset_registry()

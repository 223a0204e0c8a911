"""Store options are typed: mypy catches a misspelt option, old names warn and still work."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from agent_stores import open_checkpointer, open_memory, open_sessions
from agent_stores.backends.memory import MemoryKV
from agent_stores.checkpointer import Checkpointer
from agent_stores.memory import KVMemoryStore

USER_SCRIPT = """
from agent_stores import open_checkpointer, open_memory, open_sessions

sessions = open_sessions("memory://", lease_second=30)
memory = open_memory("memory://", receipt_tll_seconds=60)
runs = open_checkpointer("memory://", scope_prefx="app/")
fine = open_sessions("memory://", lease_seconds=30, kv_options={"clock": None})
"""


def test_mypy_strict_catches_misspelt_options(tmp_path: Path) -> None:
    from mypy import api

    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    config = tmp_path / "mypy.ini"
    # Pydantic AI is not what is checked here, and analysing it takes minutes.
    config.write_text(
        "[mypy]\n[mypy-pydantic_ai.*,pydantic_ai_harness.*,pydantic.*,opentelemetry.*]\n"
        "follow_imports = skip\nfollow_untyped_imports = true\n"
    )
    out, err, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--config-file",
            str(config),
            str(script),
        ]
    )
    assert status == 1, out + err
    assert '"lease_second"' in out
    assert '"receipt_tll_seconds"' in out
    assert '"scope_prefx"' in out
    assert out.count("error:") == 3, out


def test_old_option_names_warn_and_still_work() -> None:
    kv = MemoryKV()
    with pytest.warns(DeprecationWarning, match="receipt_ttl= is deprecated.*receipt_ttl_seconds"):
        memory = KVMemoryStore(kv, receipt_ttl=60)
    assert memory._receipt_ttl == 60
    with pytest.warns(DeprecationWarning, match="namespace= is deprecated.*scope_prefix"):
        runs = Checkpointer(kv, namespace="legacy")
    assert runs.space.scope_prefix == "legacy/"
    assert runs.space.scope("r1") == "legacy/run/r1"  # the layout the old name gave
    with pytest.warns(DeprecationWarning, match="ttl= is deprecated.*ttl_seconds"):
        runs = Checkpointer(kv, ttl=120)
    assert runs.space.ttl == 120


async def test_new_names_reach_the_stores() -> None:
    async with open_checkpointer("memory://typed", scope_prefix="app/", ttl_seconds=90) as runs:
        assert runs.space.scope_prefix == "app/" and runs.space.ttl == 90
    async with open_memory("memory://typed", receipt_ttl_seconds=30) as memory:
        assert memory._receipt_ttl == 30
    async with open_sessions("memory://typed", scope_prefix="s:", lease_seconds=5) as sessions:
        assert sessions.lease_seconds == 5

"""``agent-stores doctor``: the command line around ``agent_stores.doctor.scan``.

What the scan finds and repairs on every backend is in the damage contract
(``agent_stores_contract.damage``); this covers the command's output, exit status and JSON.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_stores import open_kv
from agent_stores.cli import cli
from agent_stores.damage import list_quarantined
from agent_stores.memory import KVMemoryStore
from click.testing import CliRunner


async def _plant(url: str) -> None:
    kv = open_kv(url)
    async with KVMemoryStore(kv, owns_kv=True) as memory:
        await memory.write("dave/main/MEMORY.md", "healthy", expected_version=None)
        await memory.write("dave/main/notes.md", "soon garbage", expected_version=None)
        scope = memory.directory_scope("dave/main")
        entry = await kv.get(scope, "notes.md")
        assert entry is not None
        await kv.replace(scope, "notes.md", b"\xffgarbage", expected_version=entry.version)


def test_doctor_lists_then_repairs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/doctor.db"
    asyncio.run(_plant(url))
    runner = CliRunner()

    listed = runner.invoke(cli, ["doctor", url])
    assert listed.exit_code == 1, listed.output
    assert "memory undecodable" in listed.output and "notes.md" in listed.output
    assert "--repair would quarantine" in listed.output

    as_json = runner.invoke(cli, ["doctor", url, "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert [(f["store"], f["kind"], f["key"]) for f in report["findings"]] == [
        ("memory", "undecodable", "notes.md")
    ]
    assert report["healthy"] is False and report["scanned"]["memory"] >= 1

    repaired = runner.invoke(cli, ["doctor", url, "--repair", "--json"])
    assert repaired.exit_code == 0, repaired.output
    assert json.loads(repaired.stdout)["findings"][0]["repaired"] is True

    clean = runner.invoke(cli, ["doctor", url])
    assert clean.exit_code == 0 and "no damaged records" in clean.output

    asyncio.run(_check_repaired(url))


async def _check_repaired(url: str) -> None:
    kv = open_kv(url)
    async with KVMemoryStore(kv, owns_kv=True) as memory:
        assert await memory.list_paths("", limit=10) == ["dave/main/MEMORY.md"]
        assert [q.raw for q in await list_quarantined(kv)] == [b"\xffgarbage"]


def test_doctor_is_listed_in_help() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert "doctor" in result.output


def test_quarantine_of_a_large_record_on_small_items_uses_few_entries() -> None:
    """On 1 KiB items (the KV contract's smallest limit) a 4,000-byte record is quarantined in
    about 4 entries, never one per byte, and reads back byte-equal."""
    from agent_stores.damage import decode_quarantined, encode_quarantined
    from agent_stores.kv.base import Entry

    raw = bytes(range(256)) * 15 + b"x" * 160
    entry = Entry(value=raw, version="v1", expires_at=None)
    reason = "undecodable: " + "é" * 600
    parts = encode_quarantined("memory:u/main", "a.md", entry, reason, 1_000.0, 1024)
    assert len(parts) <= 6, f"{len(parts)} entries for {len(raw)} bytes"
    assert all(len(value) <= 1024 for _, value in parts)
    (key, first), *rest = parts
    found = decode_quarantined(key, first, [value for _, value in rest])
    assert found.raw == raw and found.origin_key == "a.md" and found.version == "v1"


def test_doctor_quarantines_a_damaged_vector_record(tmp_path: Path) -> None:
    """A vector record that does not decode is listed and quarantined; the next search
    computes it again."""
    from agent_stores.memory import SearchConfig
    from agent_stores_contract.embedding import ConceptEmbeddingModel

    url = f"sqlite:///{tmp_path}/doctor.db"
    model = ConceptEmbeddingModel()
    search = SearchConfig(mode="semantic", embedder=model)
    bounds = {"limit": 5, "max_files": 10, "max_chars": 1000, "max_file_chars": 1000}

    async def plant() -> str:
        kv = open_kv(url)
        async with KVMemoryStore(kv, owns_kv=True, search=search) as memory:
            await memory.write("u/a.md", "daughter Maya", expected_version=None)
            await memory.wait_indexed()
            assert memory.semantic_index is not None
            scope, key = memory.directory_scope("u"), memory.semantic_index.key("a.md")
            entry = await kv.get(scope, key)
            assert entry is not None
            await kv.replace(scope, key, b"{broken", expected_version=entry.version)
            return key

    async def search_after() -> list[str]:
        kv = open_kv(url)
        async with KVMemoryStore(kv, owns_kv=True, search=search) as memory:
            found = await memory.search("u/", "family", **bounds)
            return [m.path for m in found.matches]

    key = asyncio.run(plant())
    runner = CliRunner()
    listed = runner.invoke(cli, ["doctor", url, "--json"])
    assert listed.exit_code == 1, listed.output
    [finding] = json.loads(listed.stdout)["findings"]
    assert (finding["kind"], finding["key"]) == ("undecodable", key)
    assert "the next search or reindex computes it again" in finding["repair"]
    assert runner.invoke(cli, ["doctor", url, "--repair"]).exit_code == 0
    assert runner.invoke(cli, ["doctor", url]).exit_code == 0
    assert asyncio.run(search_after()) == ["u/a.md"]
    assert len(model.documents) == 2

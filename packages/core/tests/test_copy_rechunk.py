"""Re-chunking a unit for a smaller value limit (:func:`agent_stores.transfer.rechunk.fit`)
when it cannot be re-cut as it is, and comparing re-chunked units by content.

The units are written by the stores on ``memory://`` (64 KB per entry), then fitted to a
4 KB destination, some after damage an interrupted or faulty writer could leave.
"""

from __future__ import annotations

import uuid

from agent_stores import connect
from agent_stores.checkpointer.codec import decode_record, digest
from agent_stores.kv.base import Entry
from agent_stores.transfer.rechunk import content_view, fit
from pydantic_ai.messages import ModelRequest, UserPromptPart

SOURCE_LIMIT = 64 << 10
LIMIT = 4096
NOW = 1_700_000_000.0


def source_url(limit: int = SOURCE_LIMIT) -> str:
    return f"memory://rechunk-{uuid.uuid4().hex[:10]}?max_value_bytes={limit}"


async def snapshot(url: str, scope: str) -> dict[str, Entry]:
    async with connect(url) as conn:
        out: dict[str, Entry] = {}
        async for item in conn.kv.iter_scan(scope, values=True):
            assert item.entry is not None
            out[item.key] = item.entry
        return out


async def session_unit() -> dict[str, Entry]:
    """A session whose one history chunk (about 20 KB) is a single part on the source."""
    url = source_url()
    async with connect(url) as conn:
        await conn.kv.setup()
        async with conn.sessions().turn("s") as session:
            session.replace([ModelRequest(parts=[UserPromptPart(content="a" * 20_000)])])
        entries = await snapshot(url, "session:s")
    assert [k for k in entries if k.startswith("h/")] and "state" in entries
    return entries


async def run_unit() -> dict[str, Entry]:
    """A run with a 100 KB journal entry (a stub and two chunks) and a 20 KB inline one."""
    from agent_stores.checkpointer import JournalEvent

    url = source_url()
    async with connect(url) as conn:
        await conn.kv.setup()
        checkpointer = conn.checkpointer()
        await checkpointer.append("r", JournalEvent(step_id="000001-a", payload="p" * 100_000))
        await checkpointer.append("r", JournalEvent(step_id="000002-b", payload="q" * 20_000))
        return await snapshot(url, "cp/run/r")


def history_parts(entries: dict[str, Entry]) -> list[str]:
    return sorted(k for k in entries if k.startswith("h/"))


# -- sessions ---------------------------------------------------------------------------


async def test_a_session_history_is_recut_and_its_part_count_rewritten() -> None:
    entries = await session_unit()
    fitted = fit("sessions", "session:s", entries, LIMIT, now=NOW)
    assert fitted.rechunked and not fitted.too_large
    assert all(len(e.value) <= LIMIT for e in fitted.entries.values())
    assert content_view("sessions", fitted.entries) == content_view("sessions", entries)
    assert fitted.entries["state"].value != entries["state"].value  # the part count changed


async def test_history_is_not_recut_when_the_state_does_not_decode() -> None:
    entries = await session_unit()
    [part] = history_parts(entries)
    entries["state"] = Entry(b"not a state record", "v", None)
    fitted = fit("sessions", "session:s", entries, LIMIT, now=NOW)
    assert [(t.key, t.reason) for t in fitted.too_large] == [
        (part, "the session's state does not decode, so its chunks cannot be re-cut")
    ]
    assert fitted.entries[part] is entries[part]


async def test_history_that_disagrees_with_its_reference_in_the_state_is_not_recut() -> None:
    entries = await session_unit()
    [part] = history_parts(entries)
    grown = entries[part]
    entries[part] = Entry(grown.value + b"  ", grown.version, grown.expires_at)
    fitted = fit("sessions", "session:s", entries, LIMIT, now=NOW)
    assert [(t.key, t.reason) for t in fitted.too_large] == [
        (part, "the history chunk does not match its reference in the state")
    ]
    assert fitted.entries["state"] is entries["state"]


async def test_a_state_still_too_large_after_the_recut_is_listed() -> None:
    entries = await session_unit()
    limit = len(entries["state"].value) - 20  # the history re-cuts, the state cannot
    fitted = fit("sessions", "session:s", entries, limit, now=NOW)
    assert [(t.key, t.reason) for t in fitted.too_large] == [
        ("state", "still too large after moving its data into chunks")
    ]
    assert fitted.too_large[0].size == len(fitted.entries["state"].value) > limit


# -- runs -----------------------------------------------------------------------------------


async def test_run_chunks_that_do_not_match_their_checksum_are_not_recut() -> None:
    entries = await run_unit()
    parts = sorted(k for k in entries if k.startswith("x/"))
    assert len(parts) == 2
    damaged = entries[parts[0]]
    entries[parts[0]] = Entry(bytes(reversed(damaged.value)), damaged.version, None)
    fitted = fit("runs", "cp/run/r", entries, LIMIT, now=NOW)
    reasons = {t.key: t.reason for t in fitted.too_large}
    assert reasons[parts[0]] == reasons[parts[1]] == "the run chunks do not match their checksum"
    assert fitted.entries["j/000001-a/completed"] is entries["j/000001-a/completed"]


async def test_an_inline_record_reuses_chunks_of_the_same_bytes_in_the_unit() -> None:
    entries = await run_unit()
    key = "j/000002-b/completed"
    data = entries[key].value
    sha = digest(data)
    piece = 1000
    present = {
        f"x/{sha}/{i // piece:06d}": Entry(data[i : i + piece], "v", None)
        for i in range(0, len(data), piece)
    }
    entries.update(present)
    fitted = fit("runs", "cp/run/r", entries, LIMIT, now=NOW)
    assert not fitted.too_large
    stub = decode_record(fitted.entries[key].value, what=key)
    assert stub["blob"] == {"sha256": sha, "chunks": len(present), "size": len(data)}
    # Referenced as they are: none written again at the destination's piece size.
    assert {k: e for k, e in fitted.entries.items() if k.startswith(f"x/{sha}/")} == present


# -- memory ---------------------------------------------------------------------------------


async def test_an_oversized_memory_chunk_no_file_references_is_listed() -> None:
    url = source_url()
    async with connect(url) as conn:
        await conn.kv.setup()
        await conn.memory().write("d/a.md", "a" * 10_000, expected_version=None)
    entries = await snapshot(url, "memory:d")
    orphan = "~c/gone.md/0-abc/c0"
    entries[orphan] = Entry(b"o" * (LIMIT + 1), "v", None)
    fitted = fit("memory", "memory:d", entries, LIMIT, now=NOW)
    [listed] = fitted.too_large
    assert listed.key == orphan and "collect_garbage()" in listed.reason
    assert len(fitted.entries["a.md"].value) <= LIMIT  # the file itself was re-cut


async def test_chunked_metadata_is_compared_by_content() -> None:
    """Content and metadata in chunks on the source, re-cut smaller: the same content."""
    url = source_url(limit=2048)
    async with connect(url) as conn:
        await conn.kv.setup()
        await conn.memory().write_with_metadata(
            "d/a.md", "k" * 10_000, expected_version=None, metadata={"t": "n" * 4000}
        )
    entries = await snapshot(url, "memory:d")
    assert any(k.rpartition("/")[2].startswith("m") for k in entries if k.startswith("~c/"))
    fitted = fit("memory", "memory:d", entries, 1500, now=NOW)
    assert fitted.rechunked and not fitted.too_large
    view = content_view("memory", entries)
    assert list(view) == ["a.md"] and b"n" * 4000 in view["a.md"].value
    assert content_view("memory", fitted.entries) == view
    metadata_key = next(k for k in fitted.entries if k.rpartition("/")[2] == "m0")
    changed = dict(fitted.entries)
    changed[metadata_key] = Entry(
        changed[metadata_key].value.replace(b"n", b"N", 1), "", changed[metadata_key].expires_at
    )
    assert content_view("memory", changed) != view


async def test_an_oversized_vector_record_is_left_for_the_destination_to_recompute() -> None:
    """A file's vector record too large for the destination is left out (derived data),
    never listed as too large; the file itself is re-cut and compares equal."""
    from agent_stores.memory import SearchConfig
    from agent_stores_contract.embedding import ConceptEmbeddingModel

    url = source_url()
    search = SearchConfig(mode="semantic", embedder=ConceptEmbeddingModel(dimensions=64))
    async with connect(url) as conn:
        await conn.kv.setup()
        async with conn.memory(search=search) as memory:
            text = "\n\n".join(f"daughter {i} " * 8 for i in range(40))
            await memory.write("d/a.md", text, expected_version=None)
            await memory.wait_indexed()
    entries = await snapshot(url, "memory:d")
    [vectors] = [k for k in entries if k.startswith("~v/")]
    assert len(entries[vectors].value) > LIMIT
    fitted = fit("memory", "memory:d", entries, LIMIT, now=NOW)
    assert fitted.rechunked and not fitted.too_large
    assert vectors not in fitted.entries
    assert content_view("memory", fitted.entries) == content_view("memory", entries)

"""Document ids: reversible, within Firestore's rules, and in the order Firestore sorts them.

The order test asks Google's emulator itself how it orders ``__name__``: it sorts string
document ids by their UTF-8 bytes (code point order), not by UTF-16 units; the encoding
relies on that.
"""

from __future__ import annotations

import re
import uuid

import pytest
from agent_stores.errors import InvalidIdError
from agent_stores_firestore.ids import MAX_ID_BYTES, checked_id, decode_id, encode_id
from agent_stores_firestore.kv import FirestoreKV
from hypothesis import given
from hypothesis import strategies as st

ids_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
# Characters that matter most to the encoding, drawn often.
tricky = st.text(alphabet=st.sampled_from("./-0_k\x01~\uffff\U00010000é"), min_size=1, max_size=12)


def _valid_firestore_id(doc_id: str) -> bool:
    return (
        "/" not in doc_id
        and doc_id not in {".", ".."}
        and not re.match(r"^__.*__$", doc_id, re.DOTALL)
    )


@given(st.one_of(ids_text, tricky))
def test_round_trip_and_valid(text: str) -> None:
    doc_id = encode_id(text)
    assert decode_id(doc_id) == text
    assert _valid_firestore_id(doc_id)


@given(st.one_of(ids_text, tricky), st.one_of(ids_text, tricky))
def test_order_and_prefixes_kept(a: str, b: str) -> None:
    ea, eb = encode_id(a), encode_id(b)
    # Python compares str by code point, which is UTF-8 byte order.
    assert (a < b) == (ea < eb)
    assert (a.encode() < b.encode()) == (ea.encode() < eb.encode())
    assert b.startswith(a) == eb.startswith(ea)


@pytest.mark.parametrize("bad", ["x", "k.", "k.1", "__k__"])
def test_decode_rejects_foreign_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="document id"):
        decode_id(bad)


def test_over_long_ids_are_a_typed_error() -> None:
    assert len(checked_id("key", "a" * 1499).encode()) == MAX_ID_BYTES
    with pytest.raises(InvalidIdError, match="Firestore allows 1500"):
        checked_id("key", "a" * 1500)
    with pytest.raises(InvalidIdError):
        checked_id("key", "\U0001f600" * 400)  # 400 characters, 1,600 bytes


AWKWARD = [
    "a",
    "b",
    "Z",
    "\x01",
    "\x7f",
    "-",
    ".",
    "..",
    "/",
    "a.",
    "a/",
    "a-",
    "a0",
    "__x__",
    "é",
    "\ue000",
    "\uff61",
    "\ufffd",
    "\uffff",
    "\U00010000",
    "\U0001f600",
    "\U0010ffff",
]


async def test_emulator_orders_names_by_utf8_bytes(firestore_url: str) -> None:
    """Raw ids (no encoding) come back from an ``__name__`` query in UTF-8 byte order."""
    kv = FirestoreKV.from_url(firestore_url)
    try:
        await kv.setup()  # builds the client
        raw = [i for i in AWKWARD if _valid_firestore_id(i)]
        collection = kv.client.collection(f"order-probe-{uuid.uuid4().hex[:8]}")
        for doc_id in reversed(raw):
            await collection.document(doc_id).set({"x": 1})
        listed = [snap.id async for snap in collection.order_by("__name__").stream()]
        assert listed == sorted(raw, key=lambda s: s.encode("utf-8"))
        assert listed != sorted(raw, key=lambda s: s.encode("utf-16-be"))  # the test can fail
    finally:
        await kv.aclose()


async def test_encoded_ids_scan_in_key_order(firestore_url: str) -> None:
    """Through the store: awkward keys round-trip and ``scan`` returns them in byte order."""
    kv = FirestoreKV.from_url(firestore_url)
    try:
        for key in reversed(AWKWARD):
            await kv.create("scope", key, key.encode())
        items = await kv.scan("scope", limit=100)
        assert [item.key for item in items] == sorted(AWKWARD, key=lambda s: s.encode())
        assert all(
            item.entry is not None and item.entry.value == item.key.encode() for item in items
        )
    finally:
        await kv.aclose()

"""The session chunk cache: bounded by raw bytes, and useful when sessions served in turn
need a little more than it holds (where least-recently-used eviction gets no hit at all)."""

from __future__ import annotations

from agent_stores.sessions.cache import CachedChunk, ChunkCache


def chunk(size: int) -> CachedChunk:
    return CachedChunk(b"x" * size, ())


def test_the_cache_stays_within_its_bytes_and_keeps_its_indexes_consistent() -> None:
    cache = ChunkCache(10_000)
    for i in range(500):
        cache.put(f"s{i % 7}", f"k{i}", chunk(100 + i % 300))
        if i % 11 == 0:
            cache.discard(f"s{(i - 3) % 7}", f"k{i - 3}")
        assert cache.held_bytes <= 10_000
    held = [(s, k) for s in (f"s{j}" for j in range(7)) for k in cache.keys(s)]
    chunks = [cache.get(s, k) for s, k in held]
    assert sum(len(c.raw) for c in chunks if c is not None) == cache.held_bytes
    assert None not in chunks
    assert len(cache) == len(held) > 0


def test_an_entry_just_added_or_used_is_not_the_one_evicted() -> None:
    cache = ChunkCache(10_000)
    for i in range(100):
        cache.put("s", f"k{i}", chunk(100))
    for i in range(500):
        cache.put("s", f"new{i}", chunk(100))
        assert cache.get("s", f"new{i}") is not None
        if i:
            # The previous newcomer was used three accesses ago: among the most recent eighth.
            assert cache.get("s", f"new{i - 1}") is not None


def test_a_chunk_larger_than_the_cache_is_not_kept_and_evicts_nothing() -> None:
    cache = ChunkCache(1_000)
    cache.put("s", "small", chunk(500))
    cache.put("s", "huge", chunk(1_001))
    assert cache.get("s", "huge") is None
    assert cache.get("s", "small") is not None


def test_sessions_served_in_turn_slightly_beyond_the_cache_still_hit_mostly() -> None:
    # 68 sessions of one chunk each, a cache holding 64: strict LRU would miss every time.
    cache = ChunkCache(64 * 1_000)
    hits = misses = 0
    for turn in range(20):
        for session in range(68):
            if cache.get(f"s{session}", "c") is not None:
                hits += turn > 0
            else:
                misses += turn > 0
                cache.put(f"s{session}", "c", chunk(1_000))
    assert hits / (hits + misses) > 0.6

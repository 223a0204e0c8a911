"""The bounded most-recently-used mapping the stores keep what they learned in."""

from __future__ import annotations

import random
import sys
import threading

from agent_stores.lru import LRU


def test_keeps_the_most_recently_used_keys_within_its_size() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.set("a", 1)
    lru.set("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent
    lru.set("c", 3)
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == (1, None, 3)
    lru.pop("a")
    lru.pop("missing")
    lru.discard_where(lambda key: key == "c")
    assert len(lru) == 0


def test_threads_sharing_it_never_see_a_key_vanish_mid_operation() -> None:
    """A read's look-up and its move to the end, or a write and its eviction, are one step
    for every other thread (it raised KeyError when another thread removed the key in
    between)."""
    lru: LRU[int, int] = LRU(8)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        chooser = random.Random(seed)
        try:
            for _ in range(100_000):
                key, op = chooser.randrange(12), chooser.random()
                if op < 0.4:
                    lru.get(key)
                elif op < 0.8:
                    lru.set(key, key)
                elif op < 0.98:
                    lru.pop(key)
                else:
                    lru.discard_where(lambda k: k % 3 == 0)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(lru) <= 8

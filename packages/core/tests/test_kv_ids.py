"""Versions and tokens are unique across processes, whatever the application does with
``random``: two processes that seed the global generator alike, and a forked child and its
parent, never draw the same ids."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
from agent_stores.kv.base import new_version, random_hex

DRAW = (
    "import random; random.seed(42); from agent_stores.kv.base import new_version; "
    "print(new_version())"
)


def test_versions_are_128_bit_hex_and_distinct() -> None:
    drawn = {new_version() for _ in range(10_000)}
    assert len(drawn) == 10_000
    assert all(len(v) == 32 and int(v, 16) >= 0 for v in drawn)
    assert len(random_hex(4)) == 8


def test_an_application_seeding_random_does_not_repeat_ids_across_processes() -> None:
    a, b = (
        subprocess.run([sys.executable, "-c", DRAW], capture_output=True, text=True, check=True)
        for _ in range(2)
    )
    assert a.stdout.strip() != b.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: fine here
        pid = os.fork()
    if pid == 0:
        os.write(write, new_version().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert child and child != new_version()

"""The worked example of docs/plugins.md: examples/agent-stores-dictdb, a third party's backend.

The page shows the example's port and plugin files verbatim (the docs build has no include
extension), so these tests keep the two in step and run the files: the three stores on a
``dictdb://`` URL reach the example's native ports through its hooks, one request per
operation. ``nox -s contract`` runs the whole contract on the installed example
(``example-dictdb``); test_backend_boundary.py checks that it imports nothing private.
"""

from __future__ import annotations

import re
import sys
import tomllib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agent_stores import open_checkpointer, open_memory, open_sessions
from agent_stores.checkpointer import JournalEvent, make_step_id
from agent_stores.plugins import load_registry, reset_registry
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "agent-stores-dictdb"
SOURCES = EXAMPLE / "src"
PAGE = ROOT / "docs" / "plugins.md"
SHOWN = ["plugin.py", "sessions.py", "memory.py", "journal.py"]
# A block of the page standing for one of the example's files: the not-run marker names it.
SHOWN_FILE = re.compile(
    r"<!-- not-run: the file (?P<path>examples/\S+\.py) itself[^\n]*-->\n```python\n"
    r"(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


def _shown_blocks() -> dict[str, str]:
    section = PAGE.read_text(encoding="utf-8").split("## Worked example", 1)
    assert len(section) == 2, "docs/plugins.md has no 'Worked example' section"
    return {m["path"]: m["body"] for m in SHOWN_FILE.finditer(section[1])}


def test_the_page_shows_the_example_files_verbatim() -> None:
    shown = _shown_blocks()
    package = SOURCES / "agent_stores_dictdb"
    expected = {str((package / name).relative_to(ROOT)) for name in SHOWN}
    assert set(shown) == expected, "the worked example shows other files than the ports"
    for path, body in shown.items():
        assert body == (ROOT / path).read_text(encoding="utf-8"), (
            f"docs/plugins.md's copy of {path} differs from the file: paste the file again"
        )


def test_the_example_is_not_a_workspace_member() -> None:
    """It stands for somebody else's package: installed, never part of our workspace."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members = project["tool"]["uv"]["workspace"]["members"]
    folder = str(EXAMPLE.relative_to(ROOT))
    assert not any(fnmatch(folder, pattern) for pattern in members), members
    assert "agent-stores-dictdb" not in (ROOT / "uv.lock").read_text()
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert declared["entry-points"]["agent_stores"] == {"dictdb": "agent_stores_dictdb.plugin"}


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The example loaded as its entry point would load it; the names of the requests its
    KV clients send to the database, in order."""
    monkeypatch.syspath_prepend(str(SOURCES))
    plugin = __import__("agent_stores_dictdb.plugin", fromlist=["plugin"])
    kv_module: ModuleType = __import__("agent_stores_dictdb.kv", fromlist=["kv"])
    sent: list[str] = []
    execute: Callable[..., Awaitable[Any]] = kv_module.DictKV.execute

    async def recorded(self: Any, request: str, operation: Any, *, writes: bool) -> Any:
        sent.append(request)
        return await execute(self, request, operation, writes=writes)

    monkeypatch.setattr(kv_module.DictKV, "execute", recorded)
    reset_registry(load_registry(strict=True, disabled=set(), extra_plugins=[("dictdb", plugin)]))
    try:
        yield sent
    finally:
        reset_registry()
        for name in [n for n in sys.modules if n.split(".")[0] == "agent_stores_dictdb"]:
            del sys.modules[name]


def _said(text: str) -> ModelMessage:
    return ModelRequest(parts=[UserPromptPart(text)])


def _texts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


async def test_a_turn_is_one_native_acquire_and_one_native_save(requests: list[str]) -> None:
    url = f"dictdb://test-{uuid.uuid4().hex[:8]}"
    async with open_sessions(url) as first, open_sessions(url) as second:
        async with first.turn("s") as session:
            session.replace([_said("one")])
        requests.clear()
        async with second.turn("s") as session:  # another client: nothing of "s" cached
            assert _texts(session.messages) == ["one"]
            session.replace([*session.messages, _said("two")])
        assert requests == ["sessions.acquire", "sessions.save"]
        async with first.turn("s") as session:
            assert _texts(session.messages) == ["one", "two"]


async def test_a_memory_write_with_its_receipt_is_one_native_request(
    requests: list[str],
) -> None:
    url = f"dictdb://test-{uuid.uuid4().hex[:8]}"
    operation = MemoryOperation(id="op-1", fingerprint="f")
    async with open_memory(url) as memory:
        requests.clear()
        written = await memory.write(
            "notes/a.md", "hello", expected_version=None, operation=operation
        )
        assert requests == ["memory.write"], "record, receipt and markers: one request"
        again = await memory.write(
            "notes/a.md", "hello", expected_version=None, operation=operation
        )
        assert again.version == written.version, "a retried operation replays its receipt"
        requests.clear()
        found = await memory.read("notes/a.md", max_chars=100)
        assert found is not None and found.content == "hello"
        assert requests == ["memory.read"]


async def test_an_append_is_one_native_request_and_a_retry_writes_nothing(
    requests: list[str],
) -> None:
    url = f"dictdb://test-{uuid.uuid4().hex[:8]}"
    step = make_step_id(2, "tool")
    async with open_checkpointer(url) as checkpointer:
        # The run's first append also anchors the run (its TTL): plain KV requests.
        await checkpointer.append("run", JournalEvent.completed(make_step_id(1, "model"), {}))
        requests.clear()
        first = await checkpointer.append("run", JournalEvent.completed(step, {"result": 1}))
        retried = await checkpointer.append("run", JournalEvent.completed(step, {"result": 1}))
        assert requests == ["journal.append", "journal.append"]
        assert (first.duplicate, retried.duplicate) == (False, True)
        assert retried.seq == first.seq
        state = await checkpointer.load("run")
        assert state.completed(step) and state.next_seq == first.seq + 1

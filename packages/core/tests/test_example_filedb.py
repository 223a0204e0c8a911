"""The second worked example: examples/agent-stores-filedb, a folder of files on disk.

``nox -s contract`` runs the whole contract on it (target ``example-filedb``, installed in a
throwaway virtualenv); here, quickly, that its hooks hand out its native ports, that each
store operation is one request to the folder, and that another process sees its data.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agent_stores import open_kv, open_memory, open_sessions
from agent_stores.plugins import load_registry, reset_registry
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "agent-stores-filedb"
SOURCES = EXAMPLE / "src"


def test_the_example_is_a_distribution_of_its_own() -> None:
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]
    folder = str(EXAMPLE.relative_to(ROOT))
    assert not any(fnmatch(folder, pattern) for pattern in members["members"])
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert declared["entry-points"]["agent_stores"] == {"filedb": "agent_stores_filedb.plugin"}
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '"example-filedb": ("examples/agent-stores-filedb",' in noxfile, "not a contract target"


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The example's plugin loaded as its entry point would be; the requests sent, in order."""
    monkeypatch.syspath_prepend(str(SOURCES))
    plugin = __import__("agent_stores_filedb.plugin", fromlist=["plugin"])
    kv_module: ModuleType = __import__("agent_stores_filedb.kv", fromlist=["kv"])
    sent: list[str] = []
    execute: Callable[..., Awaitable[Any]] = kv_module.FileKV.execute

    async def recorded(self: Any, request: str, run: Any, *, writes: bool) -> Any:
        sent.append(request)
        return await execute(self, request, run, writes=writes)

    monkeypatch.setattr(kv_module.FileKV, "execute", recorded)
    reset_registry(load_registry(strict=True, disabled=set(), extra_plugins=[("filedb", plugin)]))
    try:
        yield sent
    finally:
        reset_registry()
        for name in [n for n in sys.modules if n.split(".")[0] == "agent_stores_filedb"]:
            del sys.modules[name]


def _said(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text)])


async def test_native_ports_one_request_per_operation(requests: list[str], tmp_path: Path) -> None:
    url = f"filedb://{tmp_path / 'db'}"
    kv = open_kv(url)
    ports = kv.ports
    assert [type(p).__name__ for p in (ports.session, ports.memory, ports.journal)] == [
        "FileSessionPort",
        "FileMemoryPort",
        "FileJournalPort",
    ]
    await kv.aclose()
    async with open_sessions(url) as first, open_sessions(url) as second:
        async with first.turn("s") as session:
            session.replace([_said("one")])
        requests.clear()
        async with second.turn("s") as session:  # another client: nothing of "s" cached
            assert len(session.messages) == 1
            session.replace([*session.messages, _said("two")])
        assert requests == ["sessions.acquire", "sessions.save"]
    async with open_memory(url) as memory:
        requests.clear()
        operation = MemoryOperation(id="op-1", fingerprint="f")
        await memory.write("notes/a.md", "hello", expected_version=None, operation=operation)
        assert requests == ["memory.write"], "record, receipt and markers: one request"


def test_another_process_sees_the_data(requests: list[str], tmp_path: Path) -> None:
    url = f"filedb://{tmp_path / 'db'}"

    async def write() -> None:
        async with open_kv(url) as kv:
            await kv.create("scope", "key", b"written here")

    asyncio.run(write())
    reader = (
        "import asyncio, sys\n"
        "from agent_stores import open_kv\n"
        "async def main():\n"
        "    async with open_kv(sys.argv[1]) as kv:\n"
        "        print((await kv.get('scope', 'key')).value.decode())\n"
        "asyncio.run(main())\n"
    )
    # The plugin is not installed here: the child registers it the way the entry point would.
    child = (
        f"import sys; sys.path.insert(0, {str(SOURCES)!r})\n"
        "from agent_stores.plugins import load_registry, reset_registry\n"
        "import agent_stores_filedb.plugin as plugin\n"
        "reset_registry(load_registry(strict=True, disabled=set(),"
        " extra_plugins=[('filedb', plugin)]))\n" + reader
    )
    found = subprocess.run(
        [sys.executable, "-c", child, url], capture_output=True, text=True, check=True, timeout=120
    )
    assert found.stdout.strip() == "written here"

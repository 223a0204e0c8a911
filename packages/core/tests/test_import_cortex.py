"""Cortex Agent SDK Redis sessions, written by cortex-agent-sdk 0.5 itself (it needs Python
3.13: a private 3.13 venv is made with uv), imported and continued on agent-stores."""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import StoreURL, connect
from agent_stores.importers.cortex import cortex_keys, import_cortex_sessions
from agent_stores.sessions import RecoveryRequiredError
from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ModelResponse
from pydantic_ai.models.test import TestModel

REPO_ROOT = Path(__file__).resolve().parents[3]
REDIS_ENV = "AGENT_STORES_TEST_REDIS_URL"
PY313_ENV = "AGENT_STORES_TEST_PYTHON313"

WRITER = r"""
import asyncio, sys
from cortex_agent_sdk.redis import RedisSessionStore
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart

url, prefix = sys.argv[1:3]


async def main():
    store = RedisSessionStore(url, key_prefix=prefix)
    async with store.turn("alice") as session:
        session.replace([
            ModelRequest(parts=[UserPromptPart("hola")]),
            ModelResponse(parts=[TextPart("¡hola! ✓")]),
        ])
    call = ToolCallPart("pay", {"amount": 3}, tool_call_id="c-7")
    try:
        async with store.turn("bob") as session:
            await session.checkpoint([
                ModelRequest(parts=[UserPromptPart("paga la factura")]),
                ModelResponse(parts=[call]),
            ])
            await session.start_tool_turn([call])
            raise RuntimeError("the process died while the tool ran")
    except RuntimeError:
        pass
    await store.aclose()


asyncio.run(main())
"""


def _servers() -> Any:
    path = REPO_ROOT / "scripts" / "servers" / "redis.py"
    spec = importlib.util.spec_from_file_location("agent_stores_servers_redis_cortex", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def redis_base() -> Iterator[str]:
    url = os.environ.get(REDIS_ENV)
    if url:
        yield url
        return
    if shutil.which("redis-server") is None:
        pytest.fail(f"set {REDIS_ENV} or install redis-server so the tests can start one")
    with _servers().redis_servers(cluster=False) as urls:
        yield urls["redis"]


def _python313() -> str:
    candidates = [os.environ.get(PY313_ENV, "")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))
    candidates.append(shutil.which("python3.13") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"cortex-agent-sdk needs Python 3.13: install it or set {PY313_ENV}")


@pytest.fixture(scope="module")
def cortex_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python 3.13 venv with cortex-agent-sdk[redis] 0.5.0 from PyPI."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to build the Python 3.13 venv for cortex-agent-sdk")
    venv = tmp_path_factory.mktemp("cortex") / "venv"
    subprocess.run([uv, "venv", "-q", "-p", _python313(), str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "cortex-agent-sdk[redis]==0.5.0"],
        check=True,
    )
    return python


@pytest_asyncio.fixture
async def cortex_data(redis_base: str, cortex_python: str) -> AsyncIterator[tuple[Any, str]]:
    """Sessions written by Cortex itself under a fresh prefix; yields (redis client, prefix)."""
    import redis.asyncio as aioredis

    prefix = f"cortex-test-{uuid.uuid4().hex[:8]}"
    plain = StoreURL.parse(redis_base).without_query("prefix").render_with_secrets()
    writer = await asyncio.create_subprocess_exec(cortex_python, "-c", WRITER, plain, prefix)
    assert await writer.wait() == 0
    client = aioredis.Redis.from_url(plain)
    try:
        yield client, prefix
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_cortex_sessions_continue_on_agent_stores(
    cortex_data: tuple[Any, str], tmp_path: Path
) -> None:
    client, prefix = cortex_data
    url = f"sqlite:///{tmp_path}/ours.db"
    async with connect(url) as conn:
        sessions = conn.sessions()
        report = await import_cortex_sessions(
            client, sessions, key_prefix=prefix, session_ids=["alice", "bob"]
        )
        assert report.ok and report.imported == 2, report.lines()
        # The history goes on as an agent-stores session, with the same messages.
        async with sessions.turn("alice") as session:
            assert [type(m) for m in session.messages] == [ModelRequest, ModelResponse]
            assert session.messages[0].parts[0].content == "hola"  # type: ignore[union-attr]
            assert session.messages[1].parts[0].content == "¡hola! ✓"  # type: ignore[union-attr]
            agent: Any = Agent(TestModel(custom_output_text="¿algo más?"))
            result = await agent.run("gracias", message_history=session.messages)
            session.replace(result.all_messages())
        continued = await sessions.read_messages("alice")
        assert continued is not None and len(continued) == 4
        # Cortex's recovery marker became the fail-closed latch.
        with pytest.raises(RecoveryRequiredError):
            async with sessions.turn("bob", timeout_seconds=1):
                pass
        info = await sessions.inspect("bob")
        assert info is not None
        assert [(c.tool_name, c.tool_call_id) for c in info.pending_effects] == [("pay", "c-7")]
        # Idempotent: importing again finds the session as it is and changes nothing.
        again = await import_cortex_sessions(
            client, sessions, key_prefix=prefix, session_ids=["bob"]
        )
        assert (again.imported, again.updated, again.identical) == (0, 0, 1)


async def test_without_ids_sessions_come_under_their_digest(
    cortex_data: tuple[Any, str], tmp_path: Path
) -> None:
    client, prefix = cortex_data
    async with connect(f"sqlite:///{tmp_path}/ours.db") as conn:
        sessions = conn.sessions()
        report = await import_cortex_sessions(client, sessions, key_prefix=prefix)
        assert report.imported == 2
        assert any("digest" in line for line in report.not_carried)
        digest = cortex_keys(prefix, "alice")[1].split("{")[1].split("}")[0]
        assert await sessions.read_messages(digest) is not None


async def test_a_session_under_a_cortex_turn_is_reported_then_imported(
    cortex_data: tuple[Any, str], tmp_path: Path
) -> None:
    client, prefix = cortex_data
    lease, _, _ = cortex_keys(prefix, "alice")
    await client.set(lease, b"other-owner", px=60_000)  # as Cortex's ACQUIRE script does
    async with connect(f"sqlite:///{tmp_path}/ours.db") as conn:
        sessions = conn.sessions()
        busy = await import_cortex_sessions(
            client, sessions, key_prefix=prefix, session_ids=["alice"], busy_timeout=0.2
        )
        assert not busy.ok and "held it" in busy.failed[0]
        assert await sessions.inspect("alice") is None
        await client.delete(lease)
        done = await import_cortex_sessions(
            client, sessions, key_prefix=prefix, session_ids=["alice"]
        )
        assert done.ok and done.imported == 1


async def test_history_format_is_pydantic_ai_json(cortex_data: tuple[Any, str]) -> None:
    """Guards the format the importer relies on (ModelMessagesTypeAdapter JSON, a JSON marker)."""
    client, prefix = cortex_data
    _, history_key, active_key = cortex_keys(prefix, "bob")
    history, active = await client.get(history_key), await client.get(active_key)
    assert json.loads(history)[0]["kind"] == "request"
    assert json.loads(active) == {"calls": [["pay", "c-7"]]}


def test_cli_imports_cortex_sessions(redis_base: str, cortex_python: str, tmp_path: Path) -> None:
    from agent_stores.cli import cli
    from click.testing import CliRunner

    prefix = f"cortex-cli-{uuid.uuid4().hex[:8]}"
    plain = StoreURL.parse(redis_base).without_query("prefix").render_with_secrets()
    subprocess.run([cortex_python, "-c", WRITER, plain, prefix], check=True)
    dst = f"sqlite:///{tmp_path}/ours.db"
    argv = ["import", "cortex-redis", plain, dst, "--key-prefix", prefix]
    result = CliRunner().invoke(cli, [*argv, "--session-id", "alice", "--session-id", "bob"])
    assert result.exit_code == 0, result.output
    assert "2 imported" in result.output
    again = CliRunner().invoke(cli, [*argv, "--session-id", "bob"])
    assert "1 already identical" in again.output

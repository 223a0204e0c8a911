"""``agent-stores --help`` and ``backends`` start fast: they import no command module,
no Pydantic AI, no rich and no backend driver; listing sessions, memory paths or runs
imports no Pydantic AI, harness, httpx or OpenTelemetry (checked by module, never by
timing)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_stores import open_checkpointer, open_memory, open_sessions
from agent_stores.checkpointer import JournalEvent
from agent_stores.cli import COMMANDS, SHORT_HELP_MAX, cli
from click.testing import CliRunner

# What a listing must not pay for: every command module and the heavy libraries they use.
HEAVY = (
    "pydantic_ai",
    "pydantic_ai_harness",
    "rich",
    "redis",
    "psycopg",
    "opentelemetry",
    "agent_stores.sessions",
    "agent_stores.memory",
    "agent_stores.checkpointer",
    "agent_stores.transfer",
    "agent_stores.importers",
)


def _modules_after(*args: str) -> set[str]:
    return _run(*args)[1]


def _run(*args: str) -> tuple[str, set[str]]:
    """The standard output of the command and the modules imported by its end."""
    code = (
        "import json, sys\n"
        "from agent_stores.cli import cli\n"
        "try:\n"
        f"    cli({list(args)!r}, prog_name='agent-stores')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    # No provider named in the environment: that alone would import OpenTelemetry.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_PYTHON_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout, set(json.loads(done.stderr.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY))


def test_help_imports_no_command_module() -> None:
    modules = _modules_after("--help")
    assert _heavy(modules) == []
    commands = {target.partition(":")[0] for target, _ in COMMANDS.values()}
    assert not commands & modules


def test_backends_imports_only_its_own_module() -> None:
    modules = _modules_after("backends")
    assert _heavy(modules) == []
    assert "agent_stores.cli.backends" in modules
    others = {t.partition(":")[0] for n, (t, _) in COMMANDS.items() if n != "backends"}
    assert not others & modules


def test_every_command_has_a_short_help_that_fits() -> None:
    result = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    listing = result.output.split("Commands:", 1)[1]
    for name, (_, short) in COMMANDS.items():
        assert len(short) <= SHORT_HELP_MAX, name
        assert f"{name}  " in listing and short in listing
    assert "..." not in listing
    for line in listing.splitlines():
        assert len(line) <= 80


def test_listed_help_matches_each_command() -> None:
    """Each command loads, and its own --help works (the listing is not a stale copy)."""
    for name in COMMANDS:
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)


# What a listing of stored data must not pay for: it decodes no message and reads no
# memory file, and no provider is configured that would make spans worth their import.
LISTING_HEAVY = ("pydantic_ai", "pydantic_ai_harness", "httpx", "opentelemetry")


def _listing_heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in LISTING_HEAVY)


@pytest.fixture
def seeded(tmp_path: Path) -> str:
    """A SQLite file with one session (with messages), one memory file and one run."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    url = f"sqlite:///{tmp_path}/seeded.db"

    async def seed() -> None:
        async with open_sessions(url) as sessions, sessions.turn("user-1") as session:
            session.replace(
                [
                    ModelRequest(parts=[UserPromptPart(content="hello")]),
                    ModelResponse(parts=[TextPart(content="hi")]),
                ]
            )
        async with open_memory(url) as memory:
            await memory.write("ns/agent/MEMORY.md", "notes", expected_version=None)
        async with open_checkpointer(url) as checkpointer:
            await checkpointer.append("run-1", JournalEvent.attempted("000000-model", {"q": 1}))

    asyncio.run(seed())
    return url


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sessions", "{url}", "list"], "user-1"),
        (["sessions", "{url}", "list", "--json"], '"message_count": 2'),
        (["sessions", "{url}", "show", "user-1"], "messages     2"),
        (["memory", "{url}", "ls"], "ns/agent/MEMORY.md"),
        (["runs", "{url}", "list"], "run-1"),
    ],
)
def test_listing_stored_data_imports_no_pydantic_ai(
    seeded: str, args: list[str], expected: str
) -> None:
    output, modules = _run(*(a.format(url=seeded) for a in args))
    assert expected in output
    assert _listing_heavy(modules) == []


def test_listing_an_empty_store_imports_no_pydantic_ai(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/empty.db"
    for args in (["sessions", url, "list"], ["memory", url, "ls"], ["runs", url, "list"]):
        _, modules = _run(*args)
        assert _listing_heavy(modules) == [], args


def test_showing_messages_still_imports_pydantic_ai(seeded: str) -> None:
    """The lazy imports happen where messages are decoded (the check above can fail)."""
    output, modules = _run("sessions", seeded, "show", "user-1", "--messages")
    assert "user: hello" in output and "model: hi" in output
    assert "pydantic_ai" in modules

"""``agent-stores --help`` and ``backends`` start fast: they import no command module,
no Pydantic AI, no rich and no backend driver (checked by module, never by timing)."""

from __future__ import annotations

import json
import subprocess
import sys

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
    code = (
        "import json, sys\n"
        "from agent_stores.cli import cli\n"
        "try:\n"
        f"    cli({list(args)!r}, prog_name='agent-stores')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


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

"""The ``agent-stores`` command line.

Sub-commands live in their own modules and are imported only when invoked (the group
maps names to import strings and short help lines), so ``agent-stores --help`` lists
them without importing any, and a broken optional dependency only affects its own
command. ``tests/test_cli_startup.py`` checks which modules a listing imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

from .. import __version__
from ..errors import AppError

#: command name -> ("module:attribute" of a click command, short help for the listing).
#: The short help is shown as is: keep it under ``SHORT_HELP_MAX`` characters.
COMMANDS: dict[str, tuple[str, str]] = {
    "backends": (
        "agent_stores.cli.backends:backends",
        "List installed backends and plugin load errors.",
    ),
    "check": (
        "agent_stores.cli.check:check",
        "Reach a URL and time reads; creates nothing unless asked.",
    ),
    "setup": ("agent_stores.cli.admin:setup", "Create the backend's tables or schema."),
    "purge": (
        "agent_stores.cli.admin:purge",
        "Delete expired entries the backend does not collect.",
    ),
    "erase": (
        "agent_stores.cli.erase:erase",
        "Erase a subject's sessions, memory and runs; verify.",
    ),
    "demo": ("agent_stores.cli.demo:demo", "Run the scripted agent demo (no API key)."),
    "demo-recall": (
        "agent_stores.cli.recall_demo:demo_recall",
        "An agent recalls a fact by meaning (offline, no API key).",
    ),
    "sessions": ("agent_stores.cli.sessions:sessions", "Inspect and repair sessions."),
    "conversations": (
        "agent_stores.cli.conversations:conversations",
        "List and show Pydantic AI conversations.",
    ),
    "memory": ("agent_stores.cli.memory:memory", "Browse and edit memory files."),
    "runs": ("agent_stores.cli.runs:runs", "List, show and delete checkpointed runs."),
    "doctor": (
        "agent_stores.cli.doctor:doctor",
        "Find damaged records; --repair quarantines them.",
    ),
    "copy": (
        "agent_stores.cli.copy:copy",
        "Copy sessions, memory and runs to another backend.",
    ),
    "import": (
        "agent_stores.cli.importers:import_",
        "Import from pydantic-ai-harness stores or Cortex sessions.",
    ),
}

#: Longest short help that fits the listing beside the longest name in 80 columns.
SHORT_HELP_MAX = 60


class LazyGroup(click.Group):
    """A group whose commands are imported when first used."""

    def _available(self) -> dict[str, tuple[str, str]]:
        out = {}
        for name, (target, help_text) in COMMANDS.items():
            module = target.partition(":")[0]
            if importlib.util.find_spec(module) is not None:
                out[name] = (target, help_text)
        return out

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from :data:`COMMANDS`: listing imports no command module."""
        rows = []
        available = self._available()
        for name in self.list_commands(ctx):
            if name in available:
                rows.append((name, available[name][1]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(SHORT_HELP_MAX)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._available()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry = self._available().get(cmd_name)
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        loaded: Any = getattr(importlib.import_module(module_name), attr)
        if not isinstance(loaded, click.Command):
            raise click.ClickException(f"{entry[0]} is not a click command")
        return loaded


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agent-stores")
def cli() -> None:
    """agent-stores: sessions, memory and checkpoints for Pydantic AI agents, on any database.

    URLs: memory://, sqlite:///file.db, and those of installed backends (see `backends`).
    Where a URL is optional, $AGENT_STORES_URL or the embedded SQLite file is used.
    """


def main() -> None:
    """Console-script entry point: agent-stores errors become one clean line, exit status 1."""
    try:
        cli(prog_name="agent-stores")
    except AppError as exc:
        click.secho(f"Error: {exc.code}: {exc.detail}", fg="red", err=True)
        sys.exit(1)

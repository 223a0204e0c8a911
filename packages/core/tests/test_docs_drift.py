"""The README's layout, the CLI table and the CI command never drift from the tree and the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
from agent_stores.cli import cli

ROOT = Path(__file__).resolve().parents[3]
# Top-level folders that are generated or private to a tool, not part of the layout.
UNLISTED = {"site", "dist", "wheelhouse", "build", "htmlcov"}


def _tracked_top_level_folders() -> set[str]:
    """Top-level folders holding files git tracks (a developer's scratch folders are not
    part of the layout); every folder when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {p.name for p in ROOT.iterdir() if p.is_dir()}
    return {line.split("/", 1)[0] for line in listed if "/" in line}


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _layout_block() -> str:
    readme = _readme()
    section = readme[readme.index("## Repository layout") :]
    return section.split("```")[1]


def test_readme_layout_names_every_package_and_top_level_folder() -> None:
    layout = _layout_block()
    listed = set(re.findall(r"^([\w./-]+/)\s", layout, re.MULTILINE))
    for path in listed:
        assert (ROOT / path).is_dir(), f"README layout lists {path}, which does not exist"
    expected = {f"packages/{p.parent.name}/" for p in ROOT.glob("packages/*/pyproject.toml")}
    expected |= {
        f"{name}/"
        for name in _tracked_top_level_folders()
        if not name.startswith(".") and name not in UNLISTED | {"packages"}
    }
    missing = sorted(p for p in expected if p not in listed and f"{p}" not in layout)
    assert not missing, f"README layout omits {missing}"
    for project in ROOT.glob("packages/*/pyproject.toml"):
        name = re.search(r'^name = "([^"]+)"', project.read_text(), re.MULTILINE)
        assert name is not None and name.group(1) in layout, f"layout omits {project.parent}"


def test_cli_table_lists_every_command_and_only_real_ones() -> None:
    table = (ROOT / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| `agent-stores (\w[\w-]*)", table, re.MULTILINE)
    assert isinstance(cli, click.Group)
    commands = set(cli.list_commands(click.Context(cli)))
    assert set(rows) == commands, (
        f"docs/cli.md table: missing {sorted(commands - set(rows))}, "
        f"unknown {sorted(set(rows) - commands)}"
    )
    for command, flags in re.findall(r"^\| `agent-stores (\w[\w-]*)([^`]*)`", table, re.MULTILINE):
        sub = cli.get_command(click.Context(cli), command)
        assert sub is not None
        known = {opt for param in sub.params for opt in getattr(param, "opts", [])}
        for flag in re.findall(r"(--[\w-]+)", flags):
            assert flag in known, f"docs/cli.md: `agent-stores {command}` has no {flag}"


def test_docs_name_the_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(r"The README's test command, `(uv run nox -s [\w -]+)`", ci)
    assert match is not None, ".ci/run no longer names the README's test command"
    command = match.group(1).strip()
    assert command in _readme(), f"README does not show the CI command {command!r}"
    # .ci/run runs it in lanes: every session of the command, each in some lane
    code = "\n".join(
        line for line in ci.splitlines() if not line.lstrip().startswith(("#", "log "))
    )
    run = {
        session
        for sessions in re.findall(
            r"uv run nox (?:--envdir \S+ )?-s ([\w -]+?)(?: --|\s*\|\||$)", code, re.MULTILINE
        )
        for session in sessions.split()
    }
    wanted = set(command.removeprefix("uv run nox -s ").split())
    assert wanted <= run, f".ci/run never runs {sorted(wanted - run)}"
    started = (ROOT / "docs" / "getting-started.md").read_text()
    assert command in started, f"docs/getting-started.md does not show {command!r}"

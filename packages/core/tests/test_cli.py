"""The CLI commands of the foundation: backends, check, setup, purge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_stores.cli import cli
from click.testing import CliRunner


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_backends_json_lists_embedded(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    by_scheme = {b["scheme"]: b for b in report["backends"]}
    for scheme in ("memory", "sqlite"):
        assert by_scheme[scheme]["distribution"] == "agent-stores"
        assert by_scheme[scheme]["version"]


def test_check_sqlite(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["check", f"sqlite:///{tmp_path}/c.db", "--rounds", "3"])
    assert result.exit_code == 0, result.output
    assert "CAS round trip" in result.output and "ok" in result.output


def test_check_uses_default_url(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_STORES_URL", f"sqlite:///{tmp_path}/default.db")
    result = runner.invoke(cli, ["check"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "default.db").exists()


@pytest.mark.usefixtures("fresh_registry")
def test_check_hides_password_and_fails_cleanly(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_STORES_DISABLE_PLUGINS", "redis")
    result = runner.invoke(cli, ["check", "redis://user:s3cret@localhost:6379/0"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "agent-stores-redis" in result.output


def test_unknown_scheme_suggestion(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["check", "sqllite:///x.db"])
    assert result.exit_code == 1
    assert "Did you mean 'sqlite'" in result.output


def test_setup_and_purge(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/admin.db"
    assert runner.invoke(cli, ["setup", url]).exit_code == 0
    result = runner.invoke(cli, ["purge", url])
    assert result.exit_code == 0, result.output
    assert "purged 0 expired entries" in result.output

"""The CLI commands of the foundation: backends, check, setup, purge."""

from __future__ import annotations

import json
import sqlite3
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
    result = runner.invoke(
        cli, ["check", f"sqlite:///{tmp_path}/c.db", "--rounds", "3", "--setup", "--write"]
    )
    assert result.exit_code == 0, result.output
    assert "read round trip" in result.output and "CAS round trip" in result.output
    assert result.output.rstrip().endswith("ok")


def test_check_is_read_only_by_default(runner: CliRunner, tmp_path: Path) -> None:
    """A check of a file that does not exist creates nothing; one that exists writes nothing."""
    url = f"sqlite:///{tmp_path}/misspelt.db"
    result = runner.invoke(cli, ["check", url])
    assert result.exit_code == 1
    assert "does not exist" in result.output and "--setup" in result.output
    assert not (tmp_path / "misspelt.db").exists()
    assert runner.invoke(cli, ["setup", url]).exit_code == 0
    result = runner.invoke(cli, ["check", url, "--rounds", "2"])
    assert result.exit_code == 0, result.output
    assert "connected (a first read)" in result.output and "CAS" not in result.output
    with sqlite3.connect(tmp_path / "misspelt.db") as conn:
        assert conn.execute("SELECT count(*) FROM agent_stores_kv").fetchone() == (0,)


def test_check_write_probe_leaves_nothing(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/probe.db"
    result = runner.invoke(cli, ["check", url, "--setup", "--write", "--rounds", "2"])
    assert result.exit_code == 0, result.output
    with sqlite3.connect(tmp_path / "probe.db") as conn:
        assert conn.execute("SELECT count(*) FROM agent_stores_kv").fetchone() == (0,)


def test_check_uses_default_url(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_STORES_URL", f"sqlite:///{tmp_path}/default.db")
    result = runner.invoke(cli, ["check", "--setup"])
    assert result.exit_code == 0, result.output
    assert "default.db" in result.output
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

"""The plugin: registration, lazy imports, ready clients, and installation into an empty venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_stores import ConfigError, open_kv
from agent_stores.cli.backends import backends_report
from agent_stores_postgres.kv import PostgresKV
from pg_test_support import REPO_ROOT

CHECK_LAZY = textwrap.dedent(
    """
    import sys
    import agent_stores_postgres, agent_stores_postgres.plugin
    from agent_stores.plugins import get_registry
    registry = get_registry()
    assert registry.backends["postgresql"].plugin == "postgres", registry.backends
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg_pool"))
    assert not loaded, loaded
    from agent_stores import open_kv
    kv = open_kv("postgresql://localhost/db")   # constructing still does no I/O
    print(type(kv).__name__)
    """
)


def test_plugin_import_does_not_load_psycopg() -> None:
    """Loading the plugin (every agent-stores process does) imports neither psycopg nor psycopg_pool."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK_LAZY], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PostgresKV"


def test_both_schemes_registered() -> None:
    """postgresql and postgres are registered by agent-stores-postgres and open a PostgresKV."""
    report = {b["scheme"]: b for b in backends_report()["backends"]}
    for scheme in ("postgresql", "postgres"):
        assert report[scheme]["distribution"] == "agent-stores-postgres"
        assert isinstance(open_kv(f"{scheme}://localhost/db"), PostgresKV)


def test_unknown_client_is_not_claimed() -> None:
    """kv_from_client ignores objects that are not psycopg pools."""
    with pytest.raises(ConfigError):
        open_kv(object())


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv to build the core wheel")
def test_install_into_empty_venv_brings_in_core(tmp_path: Path) -> None:
    """pip install ./packages/postgres into an empty venv installs the core too; agent-stores backends lists both schemes.

    The core (agent-stores) is not on PyPI yet, so pip is pointed at a wheel of it built
    from this checkout with --find-links: the dependency is still resolved by pip, from
    the postgres package's own metadata, not listed by hand.
    """
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run(
        ["uv", "build", "--wheel", str(REPO_ROOT / "packages" / "core"), "-o", str(wheelhouse)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    installed = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--find-links",
            str(wheelhouse),
            str(REPO_ROOT / "packages" / "postgres"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = subprocess.run(
        [str(venv / "bin" / "agent-stores"), "backends", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    schemes = {b["scheme"]: b["distribution"] for b in report["backends"]}
    assert schemes["postgresql"] == schemes["postgres"] == "agent-stores-postgres"
    assert schemes["sqlite"] == "agent-stores"
    assert report["failures"] == []

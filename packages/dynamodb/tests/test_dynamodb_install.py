"""Installing agent-stores-dynamodb into an empty virtualenv brings in the core and
registers ``dynamodb`` (``uv pip install ./packages/dynamodb``: uv resolves the
unpublished core through the workspace's sources)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dynamodb_test_support import REPO_ROOT

UV = shutil.which("uv")


def _run(*args: str | Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    result = subprocess.run(
        [str(a) for a in args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_uv_pip_install_lists_dynamodb(tmp_path: Path) -> None:
    """`uv pip install ./packages/dynamodb` into a fresh venv; `agent-stores backends` lists it."""
    assert UV is not None
    venv = tmp_path / "venv"
    _run(UV, "venv", "-q", "--python", sys.executable, venv)
    _run(UV, "pip", "install", "-q", "--python", venv / "bin" / "python", "./packages/dynamodb")
    report = json.loads(_run(venv / "bin" / "agent-stores", "backends", "--json"))
    schemes = {b["scheme"]: b for b in report["backends"]}
    assert schemes["dynamodb"]["distribution"] == "agent-stores-dynamodb"
    assert report["failures"] == []
    listing = _run(venv / "bin" / "agent-stores", "backends")
    assert "dynamodb" in listing

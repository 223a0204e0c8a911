"""Installing agent-stores-cosmos into an empty virtualenv brings in the core and registers cosmos.

``uv pip install ./packages/cosmos`` from the repository: uv resolves ``agent-stores``
through the workspace's sources, as a user of the checkout would. The third-party
dependencies (azure-cosmos, aiohttp, pluggy, …) come from the index or uv's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cosmos_test_support import REPO_ROOT

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
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_uv_pip_install_lists_cosmos(tmp_path: Path) -> None:
    """`uv pip install ./packages/cosmos` into a fresh venv; `agent-stores backends` lists cosmos."""
    assert UV is not None
    venv = tmp_path / "venv"
    _run(UV, "venv", "-q", "--python", sys.executable, venv)
    _run(UV, "pip", "install", "-q", "--python", venv / "bin" / "python", "./packages/cosmos")
    report = json.loads(_run(venv / "bin" / "agent-stores", "backends", "--json"))
    schemes = {b["scheme"]: b for b in report["backends"]}
    assert schemes["cosmos"]["distribution"] == "agent-stores-cosmos"
    assert report["failures"] == []
    text = _run(venv / "bin" / "agent-stores", "backends")
    assert "cosmos" in text
    # The plugin loads without importing the Azure SDK.
    probe = "import sys, agent_stores_cosmos.plugin; print('azure.cosmos' in sys.modules)"
    assert _run(venv / "bin" / "python", "-c", probe).strip() == "False"

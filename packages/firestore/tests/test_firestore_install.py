"""Installing agent-stores-firestore into an empty virtualenv registers ``firestore``.

``uv pip install ./packages/firestore`` from the repository resolves the core through the
workspace's sources, as a user of the checkout would; the third-party dependencies come
from the package index (uv's cache serves them offline when it has them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from firestore_test_support import REPO_ROOT

UV = shutil.which("uv")


def _run(*args: str | Path, timeout: float = 900) -> str:
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
def test_uv_pip_install_lists_firestore(tmp_path: Path) -> None:
    assert UV is not None
    venv = tmp_path / "venv"
    _run(UV, "venv", "-q", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    _run(UV, "pip", "install", "-q", "--python", python, "./packages/firestore")
    report = json.loads(_run(venv / "bin" / "agent-stores", "backends", "--json"))
    schemes = {b["scheme"]: b for b in report["backends"]}
    assert schemes["firestore"]["distribution"] == "agent-stores-firestore"
    assert report["failures"] == []
    # The plugin loads without importing the Google client (import strings only).
    probe = (
        "import sys, agent_stores_firestore.plugin; print('google.cloud.firestore' in sys.modules)"
    )
    assert _run(python, "-c", probe).strip() == "False"

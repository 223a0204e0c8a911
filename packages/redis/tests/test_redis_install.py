"""Installing agent-stores-redis into an empty virtualenv brings in the core and registers redis.

The core distribution ``agent-stores`` is not on a package index yet, so a bare
``pip install ./packages/redis`` cannot find it. Two installs are checked:

* ``uv pip install ./packages/redis`` from the repository: uv resolves ``agent-stores``
  through the workspace's sources, exactly as a user of the checkout would;
* plain ``pip install --find-links <wheels> ./packages/redis`` with only the core's wheel
  on the find-links page, i.e. what ``pip install agent-stores-redis`` does once the core
  is published.

Both need the package index for the third-party dependencies (redis, pluggy, pydantic,
click): uv's cache serves them offline when it has them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis_test_support import REPO_ROOT

UV = shutil.which("uv")


def _run(*args: str | Path, cwd: Path = REPO_ROOT, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _check_venv(venv: Path) -> None:
    python = venv / "bin" / "python"
    listed = {p["name"]: p for p in json.loads(_run(python, "-m", "pip", "list", "--format=json"))}
    assert "agent-stores" in listed and "agent-stores-redis" in listed and "redis" in listed
    report = json.loads(_run(venv / "bin" / "agent-stores", "backends", "--json"))
    schemes = {b["scheme"]: b for b in report["backends"]}
    for scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        assert schemes[scheme]["distribution"] == "agent-stores-redis"
    assert report["failures"] == []


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_uv_pip_install_brings_in_the_core(tmp_path: Path) -> None:
    """`uv pip install ./packages/redis` into an empty venv installs the core; `backends` lists redis."""
    assert UV is not None
    venv = tmp_path / "venv"
    _run(UV, "venv", "--seed", "-q", "--python", sys.executable, venv)
    _run(UV, "pip", "install", "-q", "--python", venv / "bin" / "python", "./packages/redis")
    _check_venv(venv)


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_pip_install_with_core_wheel(tmp_path: Path) -> None:
    """Plain pip, core wheel on --find-links: `pip install ./packages/redis` pulls the core in."""
    assert UV is not None
    wheels = tmp_path / "wheels"
    _run(UV, "build", "-q", "--wheel", "--out-dir", wheels, "packages/core")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(
        venv / "bin" / "python", "-m", "pip", "install", "-q",
        "--find-links", wheels, "./packages/redis",
    )  # fmt: skip
    _check_venv(venv)

"""The documented wheelhouse command and ``nox -s install`` build every distribution.

docs/install.md (and the README) give one ``pip wheel`` command for installing from a
clone; a distribution it leaves out cannot be installed by name from the wheelhouse (the
contract suite once was: it lives in ``contract-tests/``, outside ``packages/``).
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COMMAND = re.compile(r"^python -m pip wheel --no-deps -w wheelhouse (.+)$", re.MULTILINE)


def _distribution_folders() -> set[Path]:
    """Every workspace member with a ``pyproject.toml``: one distribution each."""
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]
    return {
        project.parent
        for pattern in members["members"]
        for project in ROOT.glob(f"{pattern}/pyproject.toml")
    }


def _built_by(folders: list[str]) -> set[Path]:
    return {
        project.parent for folder in folders for project in ROOT.glob(f"{folder}pyproject.toml")
    }


def test_every_distribution_is_a_workspace_member_including_the_contract() -> None:
    assert ROOT / "contract-tests" in _distribution_folders()
    assert ROOT / "packages" / "core" in _distribution_folders()


def test_documented_command_builds_every_distribution() -> None:
    for page in ("README.md", "docs/install.md"):
        commands = COMMAND.findall((ROOT / page).read_text())
        assert commands, f"{page} no longer shows the wheelhouse command"
        for folders in commands:
            assert _built_by(folders.split()) == _distribution_folders(), (
                f"{page}: `pip wheel ... {folders}` does not build every distribution"
            )


def test_install_check_builds_every_distribution() -> None:
    spec = importlib.util.spec_from_file_location(
        "install_check", ROOT / "scripts/install_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _built_by(module.DISTRIBUTIONS) == _distribution_folders()
    assert "agent-stores-contract" in (ROOT / "docs/install.md").read_text()

"""Test modules of every package run in one pytest process: their basenames must differ.

Without packages (no __init__.py), pytest imports test files by basename, so two
``test_x.py`` in different folders make collection fail for the whole run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_test_module_names_are_unique_across_packages() -> None:
    modules = [
        path.name
        for folder in [*ROOT.glob("packages/*/tests"), ROOT / "contract-tests" / "tests"]
        for path in folder.glob("*.py")
        if path.name != "conftest.py"
    ]
    clashes = sorted(name for name, count in Counter(modules).items() if count > 1)
    assert not clashes, f"test modules with the same name in several packages: {clashes}"

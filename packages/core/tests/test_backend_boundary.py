"""Our backend packages use the core only as a third party can: through its public surface.

A backend imports ``agent_stores``, ``agent_stores.backend`` (the backend author's
toolkit) and ``agent_stores.errors`` — no other core module — and never touches a name the
core keeps private (an underscore method or attribute it defines), except the ``_``
primitives a KV store implements (``docs/kv.md``) and names the backend defines itself.
The worked examples under ``examples/`` (a third party's backends, docs/plugins.md) are
held to the same rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "packages" / "core" / "src" / "agent_stores"
PUBLIC = {"agent_stores", "agent_stores.backend", "agent_stores.errors"}
# backend -> its sources: our backend packages, then the worked examples
SOURCES = {
    **{
        p.name: p / "src"
        for p in sorted((ROOT / "packages").iterdir())
        if p.name != "core" and (p / "src").is_dir()
    },
    **{
        f"examples/{p.name}": p / "src"
        for p in sorted(ROOT.glob("examples/*"))
        if (p / "src").is_dir()
    },
}
BACKENDS = list(SOURCES)


def _private_names(trees: Iterator[ast.AST]) -> set[str]:
    """Underscore functions and attributes the given modules define."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                names.update(
                    target.id
                    for item in node.body
                    if isinstance(item, ast.Assign | ast.AnnAssign)
                    for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                    if isinstance(target, ast.Name)
                )
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _kv_primitives() -> set[str]:
    """The ``_`` methods a KV store implements: the documented backend contract."""
    tree = ast.parse((CORE / "kv" / "base.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "KVStore":
            return {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name.startswith("_")
                and not item.name.startswith("__")
                and not item.name.startswith("_check")
            }
    raise AssertionError("KVStore not found in kv/base.py")


def _core_private() -> set[str]:
    trees = (ast.parse(f.read_text()) for f in CORE.rglob("*.py"))
    return _private_names(trees) - _kv_primitives()


def reaches(backend: str) -> list[str]:
    """Every place ``backend``'s sources use a core module or name that is not public."""
    files = sorted(SOURCES[backend].rglob("*.py"))
    trees = {f: ast.parse(f.read_text()) for f in files}
    own = _private_names(iter(trees.values()))
    private = _core_private() - own
    found: list[str] = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            line = getattr(node, "lineno", 0)
            for module in modules:
                if module.split(".")[0] == "agent_stores" and module not in PUBLIC:
                    found.append(f"{where}:{line}: imports {module}")
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{where}:{node.lineno}: uses the core's private {node.attr}")
    return found


def test_the_worked_example_is_checked() -> None:
    assert "examples/agent-stores-dictdb" in BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_uses_only_the_public_core(backend: str) -> None:
    found = reaches(backend)
    assert not found, (
        f"{backend} reaches past agent_stores / agent_stores.backend / agent_stores.errors "
        "(export what it needs from agent_stores.backend instead):\n  " + "\n  ".join(found)
    )


def test_the_check_finds_a_private_reach(tmp_path: Path) -> None:
    """The check itself: a module importing a core module and calling a private check."""
    tree = ast.parse("from agent_stores.kv.base import KVStore\nstore._check_open()\n")
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules == ["agent_stores.kv.base"] and "agent_stores.kv.base" not in PUBLIC
    assert "_check_open" in _core_private()
    assert "_get" not in _core_private(), "a KV primitive is the backend's to implement"

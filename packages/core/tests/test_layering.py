"""The core's layers point one way: stores read their KV store's ports and never reach up
to the plugin registry or the port resolution that asks it.

Only the selection layer (``selection``, ``connection``, ``native`` itself, the CLI and the
``backend`` re-export module) may import ``agent_stores.plugins`` or ``agent_stores.native``;
a store module (sessions, memory, checkpointer), a KV module or a built-in backend that
does fails here, naming the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "src" / "agent_stores"
UPWARD = {"agent_stores.plugins", "agent_stores.native"}
SELECTION_LAYER = {"selection.py", "connection.py", "native.py", "plugins.py", "backend.py", "cli"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _guarded_modules() -> list[Path]:
    return sorted(
        path
        for path in CORE.rglob("*.py")
        if path.relative_to(CORE).parts[0] not in SELECTION_LAYER
    )


@pytest.mark.parametrize("path", _guarded_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_no_store_or_kv_module_reaches_up_to_the_plugins(path: Path) -> None:
    upward = sorted(_imports(path) & UPWARD)
    assert not upward, (
        f"{path.relative_to(CORE)} imports {upward}: stores take their ports from "
        "kv.ports; only the selection layer asks the plugins"
    )


def test_the_guard_sees_an_upward_import() -> None:
    """The check is not vacuous: the modules that resolve ports are found importing them."""
    assert "agent_stores.plugins" in _imports(CORE / "native.py")
    assert "agent_stores.native" in _imports(CORE / "selection.py")

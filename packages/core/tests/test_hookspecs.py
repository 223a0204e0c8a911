"""Every hook spec is typed, documented in its docstring and in docs/plugins.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pluggy
from agent_stores import hookspecs

DOCS = Path(__file__).resolve().parents[3] / "docs" / "plugins.md"


def _hookspecs() -> dict[str, object]:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    return {
        name: getattr(hookspecs, name) for name in vars(manager.hook) if not name.startswith("_")
    }


def test_expected_hooks_exist() -> None:
    assert set(_hookspecs()) == {
        "register_backends",
        "kv_from_client",
        "session_port",
        "memory_port",
        "journal_port",
        "vector_port",
        "session_store",
        "fault_injector",
        "proxied_url",
        "server_address",
    }


def test_store_hooks_are_firstresult() -> None:
    for name in (
        "kv_from_client",
        "session_port",
        "memory_port",
        "journal_port",
        "vector_port",
        "session_store",
        "fault_injector",
        "proxied_url",
        "server_address",
    ):
        opts = getattr(hookspecs, name).agent_stores_spec
        assert opts["firstresult"] is True, name


def test_every_hook_has_docstring_and_annotations() -> None:
    for name, func in _hookspecs().items():
        assert inspect.getdoc(func), f"hook {name} has no docstring"
        signature = inspect.signature(func)  # type: ignore[arg-type]
        for param in signature.parameters.values():
            assert param.annotation is not inspect.Parameter.empty, (
                f"{name}({param.name}) is untyped"
            )
        assert signature.return_annotation is not inspect.Signature.empty, (
            f"{name} has no return type"
        )


def test_every_hook_is_documented_in_plugins_page() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^### `(\w+)\(", text, flags=re.MULTILINE))
    missing = set(_hookspecs()) - documented
    assert not missing, f"hooks missing from docs/plugins.md: {sorted(missing)}"

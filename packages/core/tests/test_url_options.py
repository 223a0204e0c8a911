"""URL options are declared once per backend: the parser refuses anything else, and the
reference page, docs/reference/url-options.md, is generated from the declarations."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from agent_stores import StoreURL, UnknownOptionError
from agent_stores.backend import URLOption, URLOptions
from agent_stores.backends.sqlite import SQLiteKV

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    """``scripts/url_options.py``, the page's generator."""
    path = ROOT / "scripts" / "url_options.py"
    spec = importlib.util.spec_from_file_location("url_options_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_the_reference_page_is_generated_from_the_declarations(generator: ModuleType) -> None:
    page = ROOT / "docs" / "reference" / "url-options.md"
    assert page.read_text() == generator.render(), (
        "docs/reference/url-options.md is out of date: run "
        "`.venv/bin/python scripts/url_options.py --write`"
    )


def test_every_backend_declares_auto_setup_and_deadline(generator: ModuleType) -> None:
    """One meaning on every backend: each of the checkout's backends accepts both."""
    found = generator.backends()
    assert {b.schemes[0] for b in found} >= {
        "memory",
        "sqlite",
        "redis",
        "postgresql",
        "dynamodb",
        "cosmos",
        "firestore",
    }
    for backend in found:
        assert {"auto_setup", "deadline"} <= backend.options.names, backend.schemes
        auto_setup = backend.options["auto_setup"]
        assert auto_setup.type == "bool" and isinstance(auto_setup.default, bool)


def test_the_page_is_in_the_docs_navigation() -> None:
    assert "reference/url-options.md" in (ROOT / "mkdocs.yml").read_text()


def test_a_declaration_is_what_the_parser_accepts() -> None:
    options = URLOptions(
        URLOption("size", "int", 1, "how many"),
        URLOption("mode", "str", "a", "which", choices=("a", "b")),
    )
    options.check(StoreURL.parse("x://h?size=2&mode=b"))
    options.check(StoreURL.parse("x://h?extra=1"), "extra")
    with pytest.raises(UnknownOptionError) as caught:
        options.check(StoreURL.parse("x://h?sise=2"))
    assert caught.value.unknown == ["sise"] and caught.value.valid == ["mode", "size"]


def test_a_declaration_refuses_what_it_cannot_document() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        URLOptions(URLOption("a", "int", 1, "x"), URLOption("a", "int", 2, "y"))
    with pytest.raises(ValueError, match="type must be one of"):
        URLOption("a", "list", None, "x")
    with pytest.raises(ValueError, match="only a str option has choices"):
        URLOption("a", "int", 1, "x", choices=("1",))


def test_declared_by_finds_the_class_of_a_bound_factory() -> None:
    assert URLOptions.declared_by(SQLiteKV.from_url) is SQLiteKV.url_options

    def factory(url: StoreURL) -> None:
        """A plain function declares its options as an attribute of its own."""

    assert URLOptions.declared_by(factory) is None
    declared = URLOptions(URLOption("a", "bool", True, "x"))
    factory.url_options = declared  # type: ignore[attr-defined]
    assert URLOptions.declared_by(factory) is declared


def test_defaults_and_secrets_as_the_table_shows_them() -> None:
    assert URLOption("a", "bool", False, "x").default_text() == "false"
    assert URLOption("a", "float", 20.0, "x").default_text() == "20"
    assert URLOption("a", "float", 0.5, "x").default_text() == "0.5"
    assert URLOption("a", "str", None, "x").default_text() == "\u2014"
    assert URLOption("account_key", "str", None, "x").secret
    assert not URLOption("prefix", "str", None, "x").secret

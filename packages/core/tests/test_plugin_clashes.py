"""Two plugins registering one URL scheme: an error unless one takes it over on purpose."""

from __future__ import annotations

import pytest
from agent_stores import ConfigError, open_kv
from agent_stores.errors import PluginLoadError
from agent_stores.hookspecs import RegisterBackend, hookimpl
from agent_stores.plugins import load_registry, reset_registry

MEMORY = "agent_stores.backends.memory:MemoryKV.from_url"


class Registers:
    """A plugin registering ``scheme``, optionally with ``clobber=True``."""

    def __init__(self, scheme: str, *, clobber: bool = False) -> None:
        self.scheme = scheme
        self.clobber = clobber

    @hookimpl
    def register_backends(self, register: RegisterBackend) -> None:
        register(self.scheme, MEMORY, description="test", clobber=self.clobber)


def test_a_duplicate_scheme_is_refused_and_reported() -> None:
    registry = load_registry(
        strict=False,
        disabled=set(),
        extra_plugins=[("first", Registers("twice")), ("second", Registers("twice"))],
    )
    assert "twice" not in registry.backends
    assert registry.clashes["twice"].plugins == ("first", "second")
    reset_registry(registry)
    try:
        with pytest.raises(ConfigError, match=r"registered by several plugins.*'first', 'second'"):
            open_kv("twice://x")
        from agent_stores.cli.backends import backends_report

        clashes = backends_report()["clashes"]
        assert [c["scheme"] for c in clashes] == ["twice"]
    finally:
        reset_registry()


def test_a_duplicate_scheme_is_fatal_in_strict_mode() -> None:
    with pytest.raises(PluginLoadError, match="twice"):
        load_registry(
            strict=True,
            disabled=set(),
            extra_plugins=[("first", Registers("twice")), ("second", Registers("twice"))],
        )


@pytest.mark.parametrize("clobber_first", [True, False])
def test_clobber_takes_a_scheme_over_whatever_the_order(clobber_first: bool) -> None:
    plugins: list[tuple[str, object]] = [
        ("plain", Registers("sqlite")),
    ]
    taker = ("taker", Registers("sqlite", clobber=True))
    plugins = [taker, *plugins] if clobber_first else [*plugins, taker]
    registry = load_registry(strict=True, disabled=set(), extra_plugins=plugins)
    assert registry.backends["sqlite"].plugin == "taker"
    assert not registry.clashes


def test_two_plugins_that_both_clobber_clash() -> None:
    registry = load_registry(
        strict=False,
        disabled=set(),
        extra_plugins=[
            ("one", Registers("both", clobber=True)),
            ("two", Registers("both", clobber=True)),
        ],
    )
    assert "both" not in registry.backends
    assert set(registry.clashes["both"].plugins) == {"one", "two"}

"""Finding and loading backend plugins.

Plugins come from the entry-point group ``agent_stores`` (the core's own ``memory://``
and ``sqlite://`` register the same way, as the plugin ``builtin``). Loading is tolerant:
a plugin that fails to import is recorded in :attr:`PluginRegistry.failures`, reported by
``agent-stores backends`` and a warning, and the others still load.

Environment switches:

* ``AGENT_STORES_STRICT_PLUGINS=1`` — a plugin failure raises :class:`PluginLoadError`.
* ``AGENT_STORES_DISABLE_PLUGINS=a,b`` — do not load the plugins named ``a`` and ``b``.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from . import hookspecs
from .errors import ConfigError, PluginLoadError

log = logging.getLogger("agent_stores.plugins")

ENTRY_POINT_GROUP = "agent_stores"
STRICT_ENV = "AGENT_STORES_STRICT_PLUGINS"
DISABLE_ENV = "AGENT_STORES_DISABLE_PLUGINS"


@dataclass(frozen=True)
class BackendInfo:
    """One registered URL scheme."""

    scheme: str
    factory: str
    plugin: str
    distribution: str | None
    version: str | None
    description: str = ""


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    plugin: str
    distribution: str | None
    error: str
    traceback: str


@dataclass(frozen=True)
class SchemeClash:
    """A scheme registered by several plugins, none of which took it over with ``clobber``."""

    scheme: str
    plugins: tuple[str, ...]

    def message(self) -> str:
        """Why the scheme cannot be opened, and how to fix it."""
        names = ", ".join(repr(p) for p in self.plugins)
        return (
            f"the URL scheme {self.scheme!r} is registered by several plugins ({names}); "
            f"disable all but one with AGENT_STORES_DISABLE_PLUGINS, or let one register it "
            f"with clobber=True"
        )


@dataclass
class PluginRegistry:
    """The loaded plugins and the schemes they registered."""

    manager: pluggy.PluginManager
    backends: dict[str, BackendInfo] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    clashes: dict[str, SchemeClash] = field(default_factory=dict)
    clobbered: dict[str, str] = field(default_factory=dict)
    """scheme -> the plugin that registered it with ``clobber=True``"""
    plugin_distributions: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    @property
    def hook(self) -> Any:
        """The pluggy hook caller."""
        return self.manager.hook


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _dist_of(ep: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


def _make_register(registry: PluginRegistry, plugin: str) -> hookspecs.RegisterBackend:
    distribution, version = registry.plugin_distributions.get(plugin, (None, None))

    def register(
        scheme: str,
        factory: str,
        *,
        description: str = "",
        clobber: bool = False,
    ) -> None:
        scheme = scheme.lower()
        if ":" not in factory:
            raise ConfigError(
                detail=f"plugin {plugin!r}: factory {factory!r} must be 'module:attribute'"
            )
        info = BackendInfo(scheme, factory, plugin, distribution, version, description)
        clash = registry.clashes.get(scheme)
        if clash is not None:
            if clobber:
                # A deliberate takeover settles a clash between plugins that did not clobber.
                del registry.clashes[scheme]
                registry.clobbered[scheme] = plugin
                registry.backends[scheme] = info
            else:
                registry.clashes[scheme] = SchemeClash(scheme, (*clash.plugins, plugin))
            return
        existing = registry.backends.get(scheme)
        if existing is None or existing.plugin == plugin:
            registry.backends[scheme] = info
            if clobber:
                registry.clobbered[scheme] = plugin
            return
        existing_clobbers = registry.clobbered.get(scheme) == existing.plugin
        if clobber and not existing_clobbers:
            registry.clobbered[scheme] = plugin
            registry.backends[scheme] = info
        elif existing_clobbers and not clobber:
            pass  # the earlier plugin took the scheme over on purpose
        else:
            del registry.backends[scheme]
            registry.clobbered.pop(scheme, None)
            registry.clashes[scheme] = SchemeClash(scheme, (existing.plugin, plugin))
            log.warning("%s", registry.clashes[scheme].message())

    return register


def load_registry(
    *,
    strict: bool | None = None,
    disabled: set[str] | None = None,
    extra_plugins: list[tuple[str, object]] | None = None,
) -> PluginRegistry:
    """Load every plugin of the entry-point group and collect their backends.

    ``strict`` and ``disabled`` default to the environment switches. ``extra_plugins``
    registers ``(name, plugin_object)`` pairs as if they came from entry points (tests,
    applications embedding a private backend).
    """
    if strict is None:
        strict = _truthy(os.environ.get(STRICT_ENV))
    if disabled is None:
        disabled = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    registry = PluginRegistry(manager)

    # (name, entry point or None, plugin object or None). Entry points are told apart by
    # where they came from, not by isinstance: with the importlib_metadata backport's finder
    # on sys.meta_path (installed by some packages' imports, pytest runs included),
    # entry_points() returns the backport's EntryPoint objects, which are not the stdlib's.
    candidates: list[tuple[str, EntryPoint | None, object]] = [
        (ep.name, ep, None)
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    ]
    candidates += [(name, None, plugin) for name, plugin in extra_plugins or []]
    for name, entry_point, given in candidates:
        if name in disabled:
            registry.disabled.append(name)
            continue
        _load_plugin(registry, manager, name, entry_point, given, strict=strict)
    if strict and registry.clashes:
        raise PluginLoadError(
            detail="; ".join(clash.message() for clash in registry.clashes.values())
        )
    return registry


def _load_plugin(
    registry: PluginRegistry,
    manager: pluggy.PluginManager,
    name: str,
    entry_point: EntryPoint | None,
    given: object,
    *,
    strict: bool,
) -> None:
    """Register one plugin and its backends; a failure is recorded (raised when ``strict``)."""
    dist = _dist_of(entry_point) if entry_point is not None else (None, None)
    registry.plugin_distributions[name] = dist
    try:
        plugin = entry_point.load() if entry_point is not None else given
        manager.register(plugin, name=name)
        single = manager.subset_hook_caller(
            "register_backends",
            remove_plugins=[p for p in manager.get_plugins() if p is not plugin],
        )
        single(register=_make_register(registry, name))
    except Exception as exc:
        if manager.has_plugin(name):
            manager.unregister(name=name)
        failure = PluginFailure(
            name, dist[0], f"{type(exc).__name__}: {exc}", traceback.format_exc()
        )
        registry.failures.append(failure)
        if strict:
            raise PluginLoadError(
                detail=f"plugin {name!r} ({dist[0] or 'unknown distribution'}) failed to load: "
                f"{failure.error} (unset {STRICT_ENV} to skip broken plugins)"
            ) from exc
        warnings.warn(
            f"agent-stores plugin {name!r} failed to load and was skipped: {failure.error}",
            RuntimeWarning,
            stacklevel=3,
        )
        log.warning("plugin %r failed to load: %s", name, failure.error)


_registry: PluginRegistry | None = None
_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = load_registry()
        return _registry


def reset_registry(registry: PluginRegistry | None = None) -> None:
    """Forget the loaded registry (or install ``registry``); the next use reloads. For tests."""
    global _registry
    with _lock:
        _registry = registry


def resolve_import_string(target: str) -> Any:
    """Import ``"package.module:attr.attr"`` and return the attribute."""
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj

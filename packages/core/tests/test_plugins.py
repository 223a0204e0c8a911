"""Plugin loading: entry points, tolerance of broken plugins, strict mode, disabling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_stores import PluginLoadError, hookimpl
from agent_stores.plugins import load_registry


def _install_fake_distribution(root: Path, name: str, module_source: str) -> None:
    """A real installed distribution (dist-info + entry point) whose plugin module is ``module_source``."""
    module = f"{name.replace('-', '_')}_plugin"
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    dist_info = root / f"{name.replace('-', '_')}-1.2.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (dist_info / "entry_points.txt").write_text(f"[agent_stores]\n{name} = {module}\n")
    (dist_info / "RECORD").write_text("")


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    _install_fake_distribution(tmp_path, "broken-backend", "raise RuntimeError('boom at import')\n")
    _install_fake_distribution(
        tmp_path,
        "good-backend",
        """
        from agent_stores import hookimpl

        @hookimpl
        def register_backends(register):
            register("goodkv", "agent_stores.backends.memory:MemoryKV.from_url", description="test")
        """,
    )
    return tmp_path


def _run_cli(args: list[str], plugin_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(plugin_path), **env}
    return subprocess.run(
        [sys.executable, "-m", "agent_stores.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
        timeout=60,
    )


def test_broken_plugin_is_reported_and_others_still_load(plugin_path: Path, tmp_path: Path) -> None:
    result = _run_cli(["backends", "--json"], plugin_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    schemes = {b["scheme"]: b for b in report["backends"]}
    assert {"memory", "sqlite", "goodkv"} <= set(schemes)
    assert schemes["goodkv"]["distribution"] == "good-backend"
    assert schemes["goodkv"]["version"] == "1.2.3"
    failure = next(f for f in report["failures"] if f["plugin"] == "broken-backend")
    assert "boom at import" in failure["error"]
    assert failure["distribution"] == "broken-backend"
    # sqlite still works with the broken plugin installed.
    db = tmp_path / "still-works.db"
    check = _run_cli(["check", "--setup", f"sqlite:///{db}"], plugin_path)
    assert check.returncode == 0, check.stderr
    assert "ok" in check.stdout


def test_human_listing_shows_the_error(plugin_path: Path) -> None:
    result = _run_cli(["backends"], plugin_path)
    assert result.returncode == 0
    assert "broken-backend" in result.stderr and "boom at import" in result.stderr
    assert "sqlite" in result.stdout


def test_strict_mode_makes_failure_fatal(plugin_path: Path) -> None:
    result = _run_cli(["backends", "--json"], plugin_path, AGENT_STORES_STRICT_PLUGINS="1")
    assert result.returncode != 0
    assert "broken-backend" in result.stderr
    assert "PLUGIN_LOAD_FAILED" in result.stderr or "PluginLoadError" in result.stderr


def test_disable_plugins_by_name(plugin_path: Path) -> None:
    result = _run_cli(
        ["backends", "--json"],
        plugin_path,
        AGENT_STORES_DISABLE_PLUGINS="broken-backend,good-backend",
    )
    report = json.loads(result.stdout)
    assert report["failures"] == []
    assert "goodkv" not in {b["scheme"] for b in report["backends"]}
    assert sorted(report["disabled"]) == ["broken-backend", "good-backend"]


def test_in_process_registration_and_strict_flag() -> None:
    class Broken:
        @hookimpl
        def register_backends(self, register: object) -> None:
            raise RuntimeError("bad register")

    class Good:
        @hookimpl
        def register_backends(self, register: object) -> None:
            register("extra", "agent_stores.backends.memory:MemoryKV.from_url")  # type: ignore[operator]

    with pytest.warns(RuntimeWarning, match="bad register"):
        registry = load_registry(
            strict=False, disabled=set(), extra_plugins=[("broken", Broken()), ("good", Good())]
        )
    assert "extra" in registry.backends and "sqlite" in registry.backends
    assert [f.plugin for f in registry.failures] == ["broken"]
    with pytest.raises(PluginLoadError, match="bad register"):
        load_registry(strict=True, disabled=set(), extra_plugins=[("broken", Broken())])


def test_builtin_backends_register_through_the_entry_point() -> None:
    registry = load_registry(strict=True, disabled=set())
    assert registry.backends["sqlite"].plugin == "builtin"
    assert registry.backends["sqlite"].distribution == "agent-stores"
    assert registry.backends["memory"].factory.startswith("agent_stores.backends.memory:")


def test_entry_points_of_another_class_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the importlib_metadata backport's finder on sys.meta_path, entry_points()
    returns the backport's EntryPoint objects, not the stdlib's: they load all the same
    (isinstance once made every plugin register nothing, so no URL scheme was known)."""
    import agent_stores.plugins as plugins

    real = plugins.entry_points(group=plugins.ENTRY_POINT_GROUP)

    class ForeignEntryPoint:
        """Quacks like an entry point; not ``importlib.metadata.EntryPoint``."""

        def __init__(self, ep: object) -> None:
            self._ep = ep
            self.name, self.group, self.dist = ep.name, ep.group, ep.dist  # type: ignore[attr-defined]

        def load(self) -> object:
            return self._ep.load()  # type: ignore[attr-defined]

    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [ForeignEntryPoint(ep) for ep in real]
    )
    registry = load_registry(strict=True, disabled=set())
    assert registry.backends["sqlite"].plugin == "builtin"
    assert registry.backends["sqlite"].distribution == "agent-stores"


def test_registering_does_not_import_backends() -> None:
    code = (
        "import sys; from agent_stores.plugins import load_registry; load_registry(); "
        "print('agent_stores.backends.sqlite' in sys.modules, 'redis' in sys.modules, 'psycopg' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False", "False"]

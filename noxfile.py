"""Development tasks: ``nox -s tests contract lint docs`` is what CI runs.

Sessions install the locked workspace (``uv.lock``) into their own virtualenv with
``uv sync --frozen``. Backends are tested against real servers started and stopped by
``scripts/servers/*.py``.

    nox -s contract                  # every backend whose server can run here
    nox -s contract -- sqlite redis  # only these
    nox -s contract -- --url URL [--install PATH_OR_REQUIREMENT ...]
                                     # any installed backend (third parties)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "contract", "lint", "docs"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = os.environ.get(
    "AGENT_STORES_NOX_PYTHON", f"{sys.version_info.major}.{sys.version_info.minor}"
)


def _install(session: nox.Session, *groups: str) -> None:
    """Install the locked workspace (every package, editable) plus dependency groups."""
    args = ["uv", "sync", "--frozen", "--all-packages", "--inexact"]
    for group in groups:
        args += ["--group", group]
    session.run_install(
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
        silent=True,
    )


def _server_module(name: str) -> ModuleType | None:
    path = ROOT / "scripts" / "servers" / f"{name}.py"
    if not path.exists():
        return None
    module_name = f"agent_stores_servers_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses look their module up in sys.modules.
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _sqlite_urls() -> Iterator[dict[str, str]]:
    folder = Path(tempfile.mkdtemp(prefix="agent-stores-contract-"))
    try:
        yield {"sqlite": f"sqlite:///{folder / 'contract.db'}"}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _memory_urls() -> Iterator[dict[str, str]]:
    name = f"contract-{uuid.uuid4().hex[:8]}"
    # The second run keeps every record under 4 KiB, so chunking is exercised everywhere.
    yield {
        "memory": f"memory://{name}",
        "memory-small-items": f"memory://{name}-small?max_value_bytes=4096",
    }


def _server_available(name: str) -> Callable[[], bool]:
    """``scripts/servers/<name>.py`` exists and its ``available()`` says the server can run."""

    def available() -> bool:
        module = _server_module(name)
        return module is not None and bool(getattr(module, "available", lambda: True)())

    return available


def _server_urls(
    name: str, starter: str
) -> Callable[[], contextlib.AbstractContextManager[dict[str, str]]]:
    """A context manager factory running ``scripts/servers/<name>.py``'s ``starter``."""

    @contextlib.contextmanager
    def urls() -> Iterator[dict[str, str]]:
        module = _server_module(name)
        assert module is not None
        with getattr(module, starter)() as found:
            yield dict(found)

    return urls


def _server_backend(
    name: str, starter: str
) -> tuple[Callable[[], bool], Callable[[], contextlib.AbstractContextManager[dict[str, str]]]]:
    return _server_available(name), _server_urls(name, starter)


# backend name -> (is it runnable here?, context manager yielding {label: url})
BACKENDS: dict[
    str, tuple[Callable[[], bool], Callable[[], contextlib.AbstractContextManager[dict[str, str]]]]
] = {
    "memory": (lambda: True, _memory_urls),
    "sqlite": (lambda: True, _sqlite_urls),
    "redis": _server_backend("redis", "redis_servers"),
    "postgres": _server_backend("postgres", "postgres_server"),
    "dynamodb": _server_backend("dynamodb", "dynamodb_server"),
    "cosmos": _server_backend("cosmos", "cosmos_server"),
    "firestore": _server_backend("firestore", "firestore_server"),
}

# Backends served by a package of their own under packages/ (with tests needing the server).
SERVER_BACKENDS = ["redis", "postgres", "dynamodb", "cosmos", "firestore"]

# Backend test modules that only subclass the contract suite (run by ``contract``).
CONTRACT_MODULES = sorted(
    str(path.relative_to(ROOT)) for path in ROOT.glob("packages/*/tests/test_*contract.py")
)


def _test_url_env(label: str) -> str:
    """The environment variable through which a backend package's tests find its server."""
    return f"AGENT_STORES_TEST_{label.upper().replace('-', '_')}_URL"


def _redacted(url: str) -> str:
    """``url`` with its password and secret query values (``key=``, ``…_token=``, …) masked.

    Standard library only: nox runs outside the project's venv.
    """
    parts = urllib.parse.urlsplit(url)
    text = url
    if parts.password is not None:
        text = text.replace(f":{parts.password}@", ":***@", 1)
    if parts.query:
        secret = ("key", "password", "secret", "token", "sig", "signature", "credential")
        query = "&".join(
            f"{name}=***" if name.lower().endswith(secret) else f"{name}{sep}{value}"
            for name, sep, value in (pair.partition("=") for pair in parts.query.split("&"))
        )
        text = text.replace(f"?{parts.query}", f"?{query}", 1)
    return text


def _run_contract(session: nox.Session, label: str, url: str, extra: list[str]) -> None:
    session.log(f"contract suite on {label}: {_redacted(url)}")
    # Through the environment, not argv: nox echoes commands, and a URL may hold a password.
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "agent_stores_contract.suite",
        *extra,
        env={"PYTHONDONTWRITEBYTECODE": "1", "AGENT_STORES_CONTRACT_URL": url},
    )


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit tests of every package (backend packages against their real servers)."""
    _install(session)
    paths = ["packages/core/tests", "contract-tests/tests"]
    env: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for name in SERVER_BACKENDS:
            package_tests = ROOT / "packages" / name / "tests"
            if not any(package_tests.glob("test_*.py")):
                continue
            available, urls = BACKENDS[name]
            if not available():
                session.error(f"the {name} tests need a {name} server and none can be started here")
            for label, url in stack.enter_context(urls()).items():
                env[_test_url_env(label)] = url
            paths.append(str(package_tests.relative_to(ROOT)))
        # The backends' contract modules run the very suite the contract session runs on
        # the same servers; here only their own tests, so CI does not run it twice.
        ignored = [f"--ignore={path}" for path in CONTRACT_MODULES]
        session.run("pytest", *paths, *ignored, *session.posargs, env=env)


@nox.session(python=PYTHON)
def contract(session: nox.Session) -> None:
    """The contract suite against our backends (posargs: names) or any URL (``--url URL``)."""
    _install(session)
    args = list(session.posargs)
    if "--url" in args:
        index = args.index("--url")
        url = args[index + 1]
        del args[index : index + 2]
        while "--install" in args:
            index = args.index("--install")
            session.install(args[index + 1])
            del args[index : index + 2]
        _run_contract(session, "the given URL", url, args)
        return
    names = [a for a in args if not a.startswith("-")]
    extra = [a for a in args if a.startswith("-")]
    unknown = set(names) - set(BACKENDS)
    if unknown:
        session.error(
            f"unknown backend(s) {sorted(unknown)}; choose from {sorted(BACKENDS)} or use --url URL"
        )
    selected = names or [name for name, (available, _) in BACKENDS.items() if available()]
    for name in selected:
        available, urls = BACKENDS[name]
        if not available():
            session.error(f"no {name} server can be started here")
        with urls() as found:
            for label, url in found.items():
                _run_contract(session, label, url, extra)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and strict mypy."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation strictly (API reference generated from docstrings)."""
    _install(session, "docs")
    site = str(Path(session.create_tmp()) / "site")
    session.run("mkdocs", "build", "--strict", "--site-dir", site, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks beside the anchors' figures (DESIGN.md §6); ``-- --quick`` for a short run."""
    _install(session)
    args = list(session.posargs)
    with contextlib.ExitStack() as stack:
        for name in ("redis", "postgres", "cosmos", "firestore"):
            available, urls = BACKENDS[name]
            if available():
                found = stack.enter_context(urls())
                args += [f"--{name}", found[name]]
            else:
                session.warn(f"no {name} server here: skipping its rows")
        session.run("python", "benchmarks/run.py", *args)

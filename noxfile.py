"""Development tasks: ``nox -s tests contract install synaptum lint docs newest lowest`` is
what CI runs.

Sessions install the locked workspace (``uv.lock``) into their own virtualenv with
``uv sync --frozen``. Backends are tested against real servers started and stopped by
``scripts/servers/*.py``.

    nox -s contract                  # every backend and example (fails naming what to install)
    nox -s contract -- sqlite redis -k EXPR   # only these; pytest options pass through
    nox -s contract -- --exclude firestore    # or AGENT_STORES_CONTRACT_EXCLUDE=firestore
    nox -s contract -- --url URL [--install PATH_OR_REQUIREMENT ...]
                                     # any backend (third parties; throwaway virtualenv)
    nox -s contract -- --conversation-store module:attribute [--install ...]
                                     # the conversation contract on any ConversationStore
    nox -s contract -- sqlite --shuffle[=SEED]     # in a shuffled order, seed printed
    nox -s contract -- dynamodb --alone 30 [--seed S]  # 30 tests drawn by a seed, each alone
    nox -s contract-deep             # the KV contract with a large model-test budget
    nox -s contract-stress -- [--runs N] [sqlite redis]   # the contract N times under CPU load
    nox -s synaptum                  # the Synaptum adapter tests on Python 3.13
    nox -s newest -- -x              # newest releases of every dependency, not uv.lock: unit
                                     # tests, contract on sqlite redis (versions printed)
    nox -s lowest -- -x              # every direct dependency at its floor: unit tests, sqlite
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import re
import shlex
import shutil
import sys
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.sessions = [
    "tests",
    "contract",
    "install",
    "synaptum",
    "lint",
    "docs",
    "newest",
    "lowest",
]
# A session whose Python is missing (3.13 for synaptum) fails instead of being skipped.
nox.options.error_on_missing_interpreters = True
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

# A backend's further targets beside its own name: each can be excluded on its own
# (``AGENT_STORES_CONTRACT_EXCLUDE=redis-cluster`` runs standalone Redis only).
SECOND_TARGETS = {"memory-small-items": "memory", "redis-cluster": "redis", "pgvector": "postgres"}

# Targets that run only part of the suite. ``pgvector`` is the postgres backend again, on
# a PostgreSQL that has the extension (its whole suite runs on the ``postgres`` target):
# there it proves the native vector index.
PARTIAL_TARGETS = {"pgvector": ("test_semantic", "test_vectors")}
FULL_SUITE = "agent_stores_contract.suite"


def _suite_parts(label: str, suite: str) -> list[str]:
    """The suite modules to run on target ``label`` for ``suite``."""
    partial = PARTIAL_TARGETS.get(label)
    if partial is None:
        return [suite]
    if suite == FULL_SUITE:
        return [f"{suite}.{module}" for module in partial]
    return [suite] if suite.rsplit(".", 1)[-1] in partial else []


# Third-party backends kept in this repository as worked examples (docs/plugins.md,
# "Worked example"): label -> (distribution folder, URL). ``nox -s contract`` runs each like
# a ``--url URL --install FOLDER`` target, in a throwaway virtualenv, so it is installed the
# way a user installs somebody else's backend and never joins the workspace. ``{tmp}`` in a
# URL is a fresh temporary folder of that run (for a backend whose data is a file).
EXAMPLE_BACKENDS: dict[str, tuple[str, str]] = {
    "example-dictdb": ("examples/agent-stores-dictdb", "dictdb://contract"),
    "example-filedb": ("examples/agent-stores-filedb", "filedb://{tmp}/contract"),
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


def _run_contract(
    session: nox.Session,
    label: str,
    url: str,
    extra: list[str],
    *,
    python_bin: str | None = None,
    env: dict[str, str] | None = None,
    suite: str = "agent_stores_contract.suite",
    order: Order | None = None,
) -> None:
    session.log(f"contract suite on {label}: {_redacted(url)}")
    if order is not None and order.alone_mode:
        _run_contract_alone(session, label, url, extra, order, python_bin, env, suite)
        return
    # Through the environment, not argv: nox echoes commands, and a URL may hold a password.
    pytest = [python_bin, "-m", "pytest"] if python_bin else ["pytest"]
    session.run(
        *pytest,
        "-p",
        "no:cacheprovider",
        "--pyargs",
        suite,
        *extra,
        env={"PYTHONDONTWRITEBYTECODE": "1", AGENT_STORES_CONTRACT_URL: url, **(env or {})},
        external=python_bin is not None,
    )


SHUFFLE_ENV = "AGENT_STORES_CONTRACT_SHUFFLE"


@dataclasses.dataclass
class Order:
    """How the contract's tests run: in the suite's order, shuffled by a seed
    (``--shuffle[=SEED]``, or ``AGENT_STORES_CONTRACT_SHUFFLE=1|SEED``), or some of them
    each alone in its own pytest process (``--alone N [--seed S]``: N tests drawn by the
    seed from the target's collected ids; ``--alone-test ID``: those ids)."""

    targets: str = ""
    shuffle_seed: int | None = None
    alone: int = 0
    seed: int = 0
    alone_tests: list[str] = dataclasses.field(default_factory=list)

    @property
    def alone_mode(self) -> bool:
        return self.alone > 0 or bool(self.alone_tests)

    def pytest_args(self) -> list[str]:
        """pytest-random-order's options for a shuffled run (none otherwise)."""
        if self.shuffle_seed is None:
            return []
        return ["--random-order-bucket=global", f"--random-order-seed={self.shuffle_seed}"]


def _seed(session: nox.Session, value: str, what: str) -> int:
    if value in ("", "1", "random"):
        return random.SystemRandom().randrange(1, 1_000_000)
    if not value.isdigit():
        session.error(f"{what} takes a whole number, not {value!r}")
    return int(value)


def _order(session: nox.Session, names: list[str], ours: dict[str, list[str]]) -> Order:
    """The run's order from ``--shuffle``, ``--alone``/``--seed``/``--alone-test`` and
    ``AGENT_STORES_CONTRACT_SHUFFLE``; the seed is logged with the command repeating it."""
    targets = " ".join(names) if names else "--url URL" if ours["--url"] else ""
    order = Order(targets=targets, alone_tests=list(ours["--alone-test"]))
    shuffle = [*ours["--shuffle"], *filter(None, [os.environ.get(SHUFFLE_ENV, "")])]
    if shuffle and shuffle[0] != "0":
        order.shuffle_seed = _seed(session, shuffle[0], "--shuffle=")
        session.log(
            f"contract order: shuffled (pytest-random-order, one global bucket), seed "
            f"{order.shuffle_seed}; repeat with: uv run nox -s contract -- {targets} "
            f"--shuffle={order.shuffle_seed}"
        )
    if ours["--alone"]:
        if not ours["--alone"][-1].isdigit() or int(ours["--alone"][-1]) < 1:
            session.error("--alone takes a number of tests (at least 1)")
        order.alone = int(ours["--alone"][-1])
        order.seed = _seed(session, (ours["--seed"] or [""])[-1], "--seed")
    elif ours["--seed"]:
        session.error("--seed goes with --alone N")
    if order.alone_mode and order.shuffle_seed is not None:
        session.error("--shuffle and --alone exclude each other (a test alone has no order)")
    return order


def _collected_ids(
    session: nox.Session, pytest: list[str], suite: str, extra: list[str], env: dict[str, str]
) -> list[str]:
    """The node ids the suite collects on this target (``-k`` and friends applied)."""
    # One id a line: pytest prints them at verbosity -1 (``-q`` once) only.
    extra = [a for a in extra if not re.fullmatch(r"-[qv]+|--quiet|--verbose", a)]
    output = session.run(
        *pytest,
        "-p",
        "no:cacheprovider",
        "--pyargs",
        suite,
        "--collect-only",
        "-q",
        *extra,
        env=env,
        external=pytest[0] != "pytest",
        silent=True,
    )
    return sorted(line.strip() for line in str(output).splitlines() if "::" in line)


def _fresh_url(url: str, index: int) -> str:
    """``url`` on storage no test has used yet, where one URL names it (a SQLite file, a
    DynamoDB table, a Cosmos DB database and container): a test run alone then meets a
    backend as a fresh server has it, and must set up what it needs itself."""
    parts = urllib.parse.urlsplit(url)
    fresh = f"alone-{index}-{uuid.uuid4().hex[:8]}"
    if parts.scheme == "sqlite" and parts.path.endswith(".db"):
        # Text replaced, not unsplit: urlunsplit would read ``sqlite:////tmp`` as host tmp.
        return url.replace(parts.path, f"{parts.path[:-3]}-{fresh}.db", 1)
    if parts.scheme == "dynamodb" and parts.hostname:
        netloc = parts.netloc.rsplit("@", 1)
        _, colon, port = netloc[-1].partition(":")
        netloc[-1] = f"agent-stores-{fresh}{colon}{port}"
        return urllib.parse.urlunsplit(parts._replace(netloc="@".join(netloc)))
    if parts.scheme == "cosmos" and parts.path.count("/") == 2:
        return urllib.parse.urlunsplit(parts._replace(path=f"/db-{fresh}/c-{fresh}"))
    return url


def _run_contract_alone(
    session: nox.Session,
    label: str,
    url: str,
    extra: list[str],
    order: Order,
    python_bin: str | None,
    env: dict[str, str] | None,
    suite: str,
) -> None:
    """Each chosen test in a pytest process of its own, on fresh storage; the failures are
    listed with the one command repeating each, and fail the target."""
    pytest = [python_bin, "-m", "pytest"] if python_bin else ["pytest"]
    base_env = {"PYTHONDONTWRITEBYTECODE": "1", AGENT_STORES_CONTRACT_URL: url, **(env or {})}
    ids = order.alone_tests
    if not ids:
        collected = _collected_ids(session, pytest, suite, extra, base_env)
        if not collected:
            session.error(f"no contract test collected on {label} to run alone")
        ids = random.Random(order.seed).sample(collected, min(order.alone, len(collected)))
        session.log(
            f"sampled alone on {label}: {len(ids)} of {len(collected)} tests drawn by seed "
            f"{order.seed}; repeat with: uv run nox -s contract -- {order.targets} "
            f"--alone {order.alone} --seed {order.seed} {shlex.join(extra)}".rstrip()
        )
    options = [a for a in extra if a not in ("-x", "--exitfirst")]
    failed: list[str] = []
    for index, test_id in enumerate(ids, 1):
        session.log(f"alone {index}/{len(ids)} on {label}: {test_id}")
        # Fresh storage only on the servers nox started, never on a URL given to it.
        own = label in BACKENDS or label in SECOND_TARGETS
        fresh = {**base_env, AGENT_STORES_CONTRACT_URL: _fresh_url(url, index) if own else url}
        try:
            session.run(
                *pytest,
                "-p",
                "no:cacheprovider",
                test_id,
                *options,
                env=fresh,
                external=python_bin is not None,
            )
        except nox.command.CommandFailed:
            failed.append(test_id)
    for test_id in failed:
        session.warn(
            f"failed alone on {label}: {test_id}; repeat with: uv run nox -s contract -- "
            f"{order.targets} --alone-test {shlex.quote(test_id)}"
        )
    if failed:
        raise nox.command.CommandFailed(f"{len(failed)} of {len(ids)} tests failed alone")


AGENT_STORES_CONTRACT_URL = "AGENT_STORES_CONTRACT_URL"
EXCLUDE_ENV = "AGENT_STORES_CONTRACT_EXCLUDE"
# pytest options whose value is the next argument (so it is not taken for a backend name).
PYTEST_VALUE_OPTIONS = {
    "-k",
    "-m",
    "-p",
    "-o",
    "-W",
    "-c",
    "-r",
    "--maxfail",
    "--deselect",
    "--ignore",
    "--junitxml",
    "--durations",
    "--tb",
    "--timeout",
    "--contract-examples",
    "--contract-timeout",
    "--basetemp",
    "--log-level",
}


def _contract_args(
    session: nox.Session, targets: Collection[str] = BACKENDS
) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """Split posargs into target names (of ``targets``), our options (--url, --install,
    --exclude) and pytest's."""
    names: list[str] = []
    ours: dict[str, list[str]] = {
        "--url": [],
        "--install": [],
        "--exclude": [],
        "--shuffle": [],
        "--alone": [],
        "--seed": [],
        "--alone-test": [],
    }
    pytest_args: list[str] = []
    args = list(session.posargs)
    while args:
        arg = args.pop(0)
        if arg == "--shuffle":
            ours[arg].append("")
        elif arg in ours:
            if not args:
                session.error(f"{arg} needs a value")
            ours[arg].append(args.pop(0))
        elif arg.split("=", 1)[0] in ours and "=" in arg:
            option, value = arg.split("=", 1)
            ours[option].append(value)
        elif arg.startswith("-"):
            pytest_args.append(arg)
            if arg in PYTEST_VALUE_OPTIONS and args:
                pytest_args.append(args.pop(0))
        elif arg in targets:
            names.append(arg)
        else:
            session.error(
                f"unknown backend {arg!r}; choose from {sorted(targets)}, use --url URL, "
                "or put pytest options after their flag (-k EXPR)"
            )
    return names, ours, pytest_args


def _why_unavailable(name: str) -> str:
    """What to install so ``name``'s server can run here (from its server script)."""
    module = _server_module(name)
    if module is None:
        return f"scripts/servers/{name}.py is missing"
    hints: list[str] = []
    for attribute in ("missing", "_missing_runtime"):
        probe = getattr(module, attribute, None)
        found = probe() if callable(probe) else None
        if found:
            hints += [str(x) for x in found] if isinstance(found, list | tuple) else [str(found)]
            break
    install = getattr(module, "INSTALL_HINT", None)
    if install and str(install) not in hints:
        hints.append(str(install))
    if hints:
        return "; ".join(hints)
    return f"its server cannot run here (see scripts/servers/{name}.py)"


@contextlib.contextmanager
def _throwaway_venv(session: nox.Session, installs: list[str]) -> Iterator[str]:
    """A fresh virtualenv with the locked workspace plus ``installs``; yields its python.

    Third-party packages go here, never into the reused nox environment, so one run's
    ``--install`` cannot leak into the next.
    """
    folder = Path(tempfile.mkdtemp(prefix="agent-stores-contract-venv-"))
    venv = folder / "venv"
    try:
        base = Path(session.virtualenv.location) / "bin" / "python"
        session.run_install(
            "uv", "venv", "--quiet", "--python", str(base), str(venv), external=True
        )
        session.run_install(
            "uv",
            "sync",
            "--frozen",
            "--all-packages",
            "--inexact",
            "--quiet",
            env={"UV_PROJECT_ENVIRONMENT": str(venv)},
            external=True,
        )
        python = str(venv / "bin" / "python")
        session.run_install("uv", "pip", "install", "--python", python, *installs, external=True)
        yield python
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _contract_on_url(
    session: nox.Session,
    ours: dict[str, list[str]],
    pytest_args: list[str],
    pytest_env: dict[str, str],
    suite: str,
    order: Order | None = None,
) -> None:
    """``--url URL [--install ...]``: the suite on one URL (a third party's backend)."""
    url = ours["--url"][0]
    if not ours["--install"]:
        _run_contract(
            session, "the given URL", url, pytest_args, env=pytest_env, suite=suite, order=order
        )
        return
    with _throwaway_venv(session, ours["--install"]) as python:
        _run_contract(
            session,
            "the given URL",
            url,
            pytest_args,
            python_bin=python,
            env=pytest_env,
            suite=suite,
            order=order,
        )


def _chosen_targets(
    session: nox.Session,
    names: list[str],
    ours: dict[str, list[str]],
    examples: Mapping[str, tuple[str, str]],
) -> tuple[list[str], set[str]]:
    """The targets to run (named, or all) and those excluded; every backend must be able to run."""
    excluded = {n for n in os.environ.get(EXCLUDE_ENV, "").replace(",", " ").split() if n}
    excluded |= set(ours["--exclude"])
    unknown = excluded - set(BACKENDS) - set(examples) - set(SECOND_TARGETS)
    if unknown:
        session.error(
            f"cannot exclude unknown backend(s) {sorted(unknown)}; known: "
            f"{sorted({*BACKENDS, *examples, *SECOND_TARGETS})}"
        )
    chosen = [n for n in (names or [*BACKENDS, *examples]) if n not in excluded]
    missing = {n: _why_unavailable(n) for n in chosen if n in BACKENDS and not BACKENDS[n][0]()}
    if missing:
        # No silent skip: a backend either runs, or the caller excluded it by name.
        lines = [f"  {n}: {why}" for n, why in missing.items()]
        session.error(
            "cannot run the contract on every selected backend:\n"
            + "\n".join(lines)
            + f"\ninstall what is named, or exclude it: --exclude NAME or {EXCLUDE_ENV}=NAME,..."
        )
    return chosen, excluded


def _contract_on_backend(
    session: nox.Session,
    name: str,
    pytest_args: list[str],
    pytest_env: dict[str, str],
    suite: str,
    outcomes: dict[str, list[str]],
    excluded: Collection[str] = (),
    order: Order | None = None,
) -> None:
    """The suite on each target of one of our backends (but the ``excluded`` ones), its
    servers started and stopped."""
    _, urls = BACKENDS[name]
    try:
        with urls() as found:
            for label, url in found.items():
                if label in excluded:
                    continue
                try:
                    for part in _suite_parts(label, suite):
                        _run_contract(
                            session,
                            label,
                            url,
                            pytest_args,
                            env=pytest_env,
                            suite=part,
                            order=order,
                        )
                    outcomes["passed"].append(label)
                except nox.command.CommandFailed:
                    outcomes["failed"].append(label)
    except nox.command.CommandFailed:
        raise
    except Exception as exc:  # a server script failed to start its server
        outcomes["failed"].append(name)
        session.warn(f"{name}: could not start its server: {exc}")


def _contract_on_example(
    session: nox.Session,
    label: str,
    example: tuple[str, str],
    pytest_args: list[str],
    pytest_env: dict[str, str],
    suite: str,
    outcomes: dict[str, list[str]],
    order: Order | None = None,
) -> None:
    """The suite on a worked example, installed like somebody else's backend."""
    folder, url = example
    try:
        with (
            _throwaway_venv(session, [str(ROOT / folder)]) as python,
            tempfile.TemporaryDirectory(prefix=f"agent-stores-{label}-") as tmp,
        ):
            _run_contract(
                session,
                label,
                url.replace("{tmp}", tmp),
                pytest_args,
                python_bin=python,
                env=pytest_env,
                suite=suite,
                order=order,
            )
        outcomes["passed"].append(label)
    except nox.command.CommandFailed:
        outcomes["failed"].append(label)


def _contract_run(
    session: nox.Session,
    pytest_env: dict[str, str],
    suite: str,
    examples: Mapping[str, tuple[str, str]] | None = None,
) -> None:
    """Run ``suite`` on the named targets, or on every backend and every one of ``examples``."""
    examples = examples or {}
    names, ours, pytest_args = _contract_args(session, [*BACKENDS, *examples])
    order = _order(session, names, ours)
    pytest_args = [*pytest_args, *order.pytest_args()]
    if ours["--url"]:
        if len(ours["--url"]) > 1 or names:
            session.error("--url takes one URL and no backend names")
        _contract_on_url(session, ours, pytest_args, pytest_env, suite, order)
        return
    if ours["--install"]:
        session.error("--install goes with --url URL (a third-party backend)")
    chosen, excluded = _chosen_targets(session, names, ours, examples)
    outcomes: dict[str, list[str]] = {"passed": [], "failed": []}
    for name in (n for n in chosen if n in BACKENDS):
        _contract_on_backend(
            session, name, pytest_args, pytest_env, suite, outcomes, excluded, order
        )
    for label in (n for n in chosen if n in examples):
        _contract_on_example(
            session, label, examples[label], pytest_args, pytest_env, suite, outcomes, order
        )
    passed, failed = outcomes["passed"], outcomes["failed"]
    session.log(f"contract summary: passed {passed or '-'}; failed {failed or '-'}")
    if excluded:
        session.log(f"contract summary: EXCLUDED by option/{EXCLUDE_ENV}: {sorted(excluded)}")
    if failed:
        session.error(f"the contract failed on {failed}")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit tests of every package (backend packages against their real servers).

    ``AGENT_STORES_TESTS_PACKAGES=dynamodb,cosmos`` runs only those packages' tests,
    ``AGENT_STORES_TESTS_EXCLUDE=...`` all but those (names: ``core``, ``contract-tests``
    and the server backends); .ci/run splits the tests between its two lanes this way.
    """
    _install(session)
    _unit_tests(session, [*_generic_path_sample(session), *session.posargs])


def _unit_tests(session: nox.Session, pytest_args: list[str]) -> None:
    """The unit tests of the packages ``_test_packages`` picks, every server started."""
    chosen = _test_packages(session)
    paths = [path for name, path in chosen.items() if name in {"core", "contract-tests"}]
    if not chosen:
        session.error(f"{TEST_PACKAGES_ENV} / {TEST_EXCLUDE_ENV} left no package to test")
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
            if name in chosen:
                paths.append(str(package_tests.relative_to(ROOT)))
        # The backends' contract modules run the very suite the contract session runs on
        # the same servers; here only their own tests, so CI does not run it twice.
        ignored = [f"--ignore={path}" for path in CONTRACT_MODULES]
        session.run("pytest", *paths, *ignored, *pytest_args, env=env)


TEST_PACKAGES_ENV, TEST_EXCLUDE_ENV = "AGENT_STORES_TESTS_PACKAGES", "AGENT_STORES_TESTS_EXCLUDE"


def _test_packages(session: nox.Session) -> dict[str, str]:
    """The packages whose tests run: name -> tests folder (every server is started anyway:
    the core's tests use them too)."""
    every = {
        "core": "packages/core/tests",
        "contract-tests": "contract-tests/tests",
        **{name: f"packages/{name}/tests" for name in SERVER_BACKENDS},
    }

    def names(variable: str) -> set[str]:
        found = {n for n in os.environ.get(variable, "").replace(",", " ").split() if n}
        if found - set(every):
            session.error(f"{variable}: unknown {sorted(found - set(every))}; known {list(every)}")
        return found

    only, excluded = names(TEST_PACKAGES_ENV), names(TEST_EXCLUDE_ENV)
    return {n: p for n, p in every.items() if (not only or n in only) and n not in excluded}


# The generic (KV-only) path's contract classes in the server packages (``Test*Generic``)
# repeat the stores' contract through the same core code on each backend. Their slow modes
# (several processes, killed processes, 50 tasks, crashes between steps) run in full on
# SQLite (packages/core/tests/test_native_ports.py) and, natively, in ``nox -s contract``
# on every backend; on the server backends the generic path runs every other test.
GENERIC_PATH_ELSEWHERE = " or ".join(
    (
        "RedisSessionsGeneric",
        "RedisMemoryGeneric",
        "PostgresSessionsGeneric",
        "PostgresMemoryGeneric",
        "PostgresCheckpointerGeneric",
        "DynamoDBSessionsGeneric",
        "DynamoDBMemoryGeneric",
    )
)
GENERIC_PATH_SLOW = " or ".join(("processes", "new_process", "killed", "50_tasks", "crash_between"))
FULL_TESTS_ENV = "AGENT_STORES_TESTS_FULL"


def _generic_path_sample(session: nox.Session) -> list[str]:
    """``-k`` leaving the generic path's slow modes out on the server backends (unless
    ``AGENT_STORES_TESTS_FULL=1``; a ``-k`` of the caller's own replaces this one)."""
    if os.environ.get(FULL_TESTS_ENV) == "1":
        return []
    session.log(
        "the generic path's slow modes (processes, kills, load) run on SQLite; on the server "
        f"backends in full with {FULL_TESTS_ENV}=1"
    )
    return ["-k", f"not (({GENERIC_PATH_ELSEWHERE}) and ({GENERIC_PATH_SLOW}))"]


# The releases users get (issue 58): uv.lock pins what every other session installs; these
# two lanes resolve the workspace afresh instead, never reading or writing uv.lock.
#: Distributions whose versions the release lanes print beside the lock's.
RELEASE_WATCH = (
    "pydantic-ai-slim",
    "pydantic-ai-harness",
    "pydantic",
    "redis",
    "hiredis",
    "psycopg",
    "psycopg-pool",
    "aioboto3",
    "aiobotocore",
    "botocore",
    "azure-cosmos",
    "aiohttp",
    "google-cloud-firestore",
    "grpcio",
    "moto",
    "numpy",
    "apsw",
    "sqlite-vec",
    "wordllama",
    "opentelemetry-api",
    "pluggy",
    "click",
    "rich",
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "hypothesis",
)
#: Contract targets of each release lane (a space- or comma-separated override).
RELEASES_CONTRACT_ENV = "AGENT_STORES_RELEASES_CONTRACT"
#: Test files or folders a release lane runs instead of every package's unit tests.
RELEASES_TESTS_ENV = "AGENT_STORES_RELEASES_TESTS"


def _locked_versions() -> dict[str, set[str]]:
    """name -> the versions uv.lock holds of it (more than one where markers split it)."""
    import tomllib

    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    found: dict[str, set[str]] = {}
    for package in lock.get("package", []):
        found.setdefault(package["name"], set()).add(str(package.get("version", "")))
    return found


def _install_resolved(session: nox.Session, resolution: str) -> None:
    """Install the workspace (every package, editable, and the dev group) resolved afresh by
    ``uv pip compile --resolution RESOLUTION`` (``highest``: the newest releases PyPI has;
    ``lowest-direct``: every direct dependency at its declared floor), synced exactly into
    the session's virtualenv; uv.lock is neither read nor written. Logs each watched
    distribution's version beside the lock's and writes the whole set to
    ``.nox/<session>/tmp/requirements-RESOLUTION.txt``."""
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    requirements = Path(session.create_tmp()) / f"requirements-{resolution}.txt"
    session.run_install(
        "uv",
        "pip",
        "compile",
        "--quiet",
        "--upgrade",  # never the previous run's pins: a new release is taken the day it is out
        "--python",
        python,
        "--resolution",
        resolution,
        "--group",
        "dev",
        "--no-header",
        "--no-annotate",
        "-o",
        str(requirements),
        external=True,
    )
    session.run_install(
        "uv", "pip", "sync", "--quiet", "--python", python, str(requirements), external=True
    )
    resolved: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            resolved[name.lower()] = version.split(";")[0].strip()
    locked = _locked_versions()
    rows = []
    for name in RELEASE_WATCH:
        got, pinned = resolved.get(name, "-"), locked.get(name, set())
        lock = "(= lock)" if got in pinned else f"(lock {' | '.join(sorted(pinned)) or '-'})"
        rows.append(f"  {name:24} {got:12} {lock}")
    differ = sum(1 for n, v in resolved.items() if n in locked and v not in locked[n])
    session.log(
        f"resolution {resolution}: {len(resolved)} distributions, {differ} at another version "
        f"than uv.lock (all of them: {requirements})\n" + "\n".join(rows)
    )


def _release_lane(session: nox.Session, resolution: str, default_targets: str) -> None:
    """The unit tests (packages as in ``nox -s tests``: ``AGENT_STORES_TESTS_PACKAGES`` /
    ``_EXCLUDE``; or only the paths in ``AGENT_STORES_RELEASES_TESTS``), then the contract
    on ``default_targets`` (or ``AGENT_STORES_RELEASES_CONTRACT``), on the workspace
    resolved with ``resolution``; posargs go to every pytest run."""
    _install_resolved(session, resolution)
    session.run("python", "-c", "import pydantic_ai, pydantic_ai_harness, agent_stores")
    targets = os.environ.get(RELEASES_CONTRACT_ENV, default_targets).replace(",", " ").split()
    unknown = [t for t in targets if t not in BACKENDS]
    if unknown:
        session.error(f"{RELEASES_CONTRACT_ENV}: unknown {unknown}; known {sorted(BACKENDS)}")
    failed: list[str] = []
    subset = os.environ.get(RELEASES_TESTS_ENV, "").replace(",", " ").split()
    try:
        if subset:
            session.log(f"unit tests: only {' '.join(subset)} ({RELEASES_TESTS_ENV})")
            session.run("pytest", *subset, *session.posargs)
        else:
            _unit_tests(session, [*_generic_path_sample(session), *session.posargs])
    except nox.command.CommandFailed:
        failed.append("unit tests")
    outcomes: dict[str, list[str]] = {"passed": [], "failed": []}
    for name in targets:
        # Each backend's own target only: Redis Cluster, the small-items memory:// and
        # pgvector runs are the lock's (nox -s contract).
        _contract_on_backend(
            session, name, list(session.posargs), {}, FULL_SUITE, outcomes, set(SECOND_TARGETS)
        )
    failed += [f"contract on {label}" for label in outcomes["failed"]]
    session.log(
        f"{resolution}: contract passed on {outcomes['passed'] or '-'}; failed: {failed or '-'}"
    )
    if failed:
        session.error(f"on the {resolution} resolution: {', '.join(failed)} failed")


@nox.session(python=PYTHON)
def newest(session: nox.Session) -> None:
    """The newest releases: every dependency (pydantic-ai-slim, pydantic-ai-harness, each
    backend's client, the test tools) resolved to the newest version PyPI has, not the lock;
    the versions printed beside the lock's; then the unit tests and the contract on SQLite
    and Redis (``AGENT_STORES_RELEASES_CONTRACT`` to change). ``-- -x``: pytest options."""
    _release_lane(session, "highest", "sqlite redis")


@nox.session(python=PYTHON)
def lowest(session: nox.Session) -> None:
    """The lowest supported versions: every direct dependency of every package at the floor
    it declares (``uv --resolution lowest-direct``; what those need, at its newest); the
    versions printed beside the lock's; then the unit tests and the contract on SQLite
    (``AGENT_STORES_RELEASES_CONTRACT`` to change). ``-- -x``: pytest options."""
    _release_lane(session, "lowest-direct", "sqlite")


@nox.session(python=False)
def install(session: nox.Session) -> None:
    """Every backend installed with plain pip into a fresh venv as docs/install.md says.

    The wheelhouse is built from ``packages/*/`` and ``contract-tests/``. Then, with that
    venv's own CLI: ``agent-stores check --setup --write`` and one agent conversation
    (``agent-stores demo``) against a private server; and, for sqlite and redis,
    ``pip install agent-stores-contract agent-stores-NAME`` into another fresh venv and the
    suite's KV and port contracts run from that installed package, outside the clone
    (``scripts/install_check.py``). ``-- NAME ...`` limits it to some backends.
    """
    names = session.posargs or ["sqlite", *SERVER_BACKENDS]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        session.error(f"unknown backend(s) {unknown}; known: {sorted(BACKENDS)}")
    with contextlib.ExitStack() as stack:
        pairs: list[str] = []
        for name in names:
            _, urls = BACKENDS[name]
            first = next(iter(stack.enter_context(urls()).values()))
            pairs += ["--url", f"{name}={first}"]
        # Through the environment, not argv: nox echoes commands, and a URL may hold a password.
        session.run(
            sys.executable,
            str(ROOT / "scripts" / "install_check.py"),
            env={"AGENT_STORES_INSTALL_CHECK_ARGS": "\n".join(pairs)},
            external=True,
        )


CONVERSATION_STORE_ENV = "AGENT_STORES_CONTRACT_CONVERSATION_STORE"
CONVERSATION_SUITE = "agent_stores_contract.suite.test_conversations"


def _conversation_store_run(session: nox.Session) -> bool:
    """``--conversation-store module:attribute [--install PKG ...]``: the conversation contract
    alone on a third party's Pydantic AI ``ConversationStore`` (no URL; the factory's shape is
    in docs/contract.md), its packages in a throwaway virtualenv. False: the option is absent."""
    spec: list[str] = []
    installs: list[str] = []
    pytest_args: list[str] = []
    args = list(session.posargs)
    while args:
        arg = args.pop(0)
        option, equals, value = arg.partition("=")
        if option in ("--conversation-store", "--install"):
            if not equals:
                if not args:
                    session.error(f"{option} needs a value")
                value = args.pop(0)
            (spec if option == "--conversation-store" else installs).append(value)
        else:
            pytest_args.append(arg)
    if not spec:
        return False
    if len(spec) > 1:
        session.error("--conversation-store takes one module:attribute")
    session.log(f"conversation contract on {spec[0]}")
    # Through the environment, as a URL is: the worker processes read it there too.
    env = {"PYTHONDONTWRITEBYTECODE": "1", CONVERSATION_STORE_ENV: spec[0]}
    args = ["-p", "no:cacheprovider", "--pyargs", CONVERSATION_SUITE, *pytest_args]
    if not installs:
        session.run("pytest", *args, env=env)
        return True
    with _throwaway_venv(session, installs) as python:
        session.run(python, "-m", "pytest", *args, env=env, external=True)
    return True


@nox.session(python=PYTHON)
def contract(session: nox.Session) -> None:
    """The contract suite on every backend and worked example (or those named), or on any URL
    (``--url URL``).

    ``-- sqlite redis -k EXPR``: backends by name (or an example's label, such as
    ``example-dictdb``: ``EXAMPLE_BACKENDS``), pytest options passed through;
    ``--exclude NAME`` (or ``AGENT_STORES_CONTRACT_EXCLUDE``) leaves a backend out, said in
    the summary; a backend whose server cannot run otherwise fails the session.
    ``--url URL [--install PKG ...]``: a third-party backend, installed into a throwaway
    virtualenv. ``--conversation-store module:attribute [--install PKG ...]``: the
    conversation contract alone, on a third party's Pydantic AI ``ConversationStore``.
    """
    _install(session)
    if _conversation_store_run(session):
        return
    _contract_run(session, {}, "agent_stores_contract.suite", EXAMPLE_BACKENDS)


@nox.session(name="contract-deep", python=PYTHON)
def contract_deep(session: nox.Session) -> None:
    """The KV contract with a large example budget for the model-based test (slow)."""
    _install(session)
    examples = os.environ.get("AGENT_STORES_CONTRACT_EXAMPLES", "400")
    env = {"AGENT_STORES_CONTRACT_EXAMPLES": examples, "AGENT_STORES_CONTRACT_TIMEOUT": "3600"}
    _contract_run(session, env, "agent_stores_contract.suite.test_kv")


SYNAPTUM_PYTHON = os.environ.get(
    "AGENT_STORES_SYNAPTUM_PYTHON",
    next(
        (
            str(p)
            for p in sorted(Path.home().glob(".pyenv/versions/3.13*/bin/python3.13"), reverse=True)
        ),
        "3.13",
    ),
)


@nox.session(python=SYNAPTUM_PYTHON)
def synaptum(session: nox.Session) -> None:
    """The Synaptum adapter tests, on Python 3.13 (Synaptum needs it), and the eager exit
    of a turn on an inline backend (Python 3.12+); then, on the same Python, the session
    contract on SQLite and memory:// (asyncio differs between 3.11, which the other
    sessions use, and 3.13: store close once spun for ever on 3.13.0)."""
    session.run_install(
        "uv",
        "sync",
        "--frozen",
        "--all-packages",
        "--inexact",
        "--extra",
        "synaptum",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
        silent=True,
    )
    # Fails here, not as a silent module-level skip, when synaptum did not install.
    session.run("python", "-c", "import synaptum")
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "packages/core/tests/test_checkpointer_synaptum.py",
        # what only Python 3.12+ does: a turn's last write as an eager task
        "packages/core/tests/test_session_inline_exit.py",
        *session.posargs,
    )
    # The Synaptum examples of docs/checkpointer.md (skipped where synaptum is missing).
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "packages/core/tests/test_docs_examples.py",
        "-k",
        "checkpointer.md",
    )
    with tempfile.TemporaryDirectory(prefix="agent-stores-py313-") as folder:
        for label, url in (
            ("SQLite", f"sqlite:///{folder}/sessions.db"),
            ("memory", "memory://"),
        ):
            _run_contract(
                session,
                f"{label}, Python 3.13",
                url,
                [],
                suite="agent_stores_contract.suite.test_sessions",
            )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check), strict mypy and the complexity check (radon)."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    _complexity_check(session)


#: The code the complexity check covers: what is shipped (packages, the contract suite,
#: the worked examples), not tests, benchmarks or scripts.
COMPLEXITY_PATHS = ("packages/*/src", "contract-tests/src", "examples/*/src")


def _complexity_check(session: nox.Session) -> None:
    """Nothing above radon grade C (cyclomatic complexity 20): ``radon cc -n D`` lists the
    functions of grade D or worse, and any line it prints fails the session. A function
    that grows past C is split along its seams (docs/design.md, "Code standards")."""
    paths = [
        str(p.relative_to(ROOT)) for pattern in COMPLEXITY_PATHS for p in sorted(ROOT.glob(pattern))
    ]
    found = session.run("radon", "cc", "-n", "D", "-s", *paths, silent=True)
    if isinstance(found, str) and found.strip():
        session.error(f"functions above radon grade C (split each along its seams):\n{found}")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation strictly (API reference generated from docstrings)."""
    _install(session, "docs")
    site = str(Path(session.create_tmp()) / "site")
    session.run("mkdocs", "build", "--strict", "--site-dir", site, env={"NO_MKDOCS_2_WARNING": "1"})


#: Python 3.13 for the anchors (cortex-agent-sdk needs it): pyenv's, else one on PATH.
BENCH_PYTHON = next(
    (
        str(p)
        for p in (
            Path.home() / ".pyenv/versions/3.13.0/bin/python3.13",
            Path("/usr/bin/python3.13"),
        )
        if p.exists()
    ),
    "python3.13",
)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """agent-stores beside the anchors in one run (``benchmarks/side_by_side.py``, Python 3.13
    venv with the anchors from PyPI), ratios printed and written to docs/benchmarks.md; then
    the per-backend figures of every backend (``benchmarks/run.py``) and the requests per
    operation on the cloud backends (``benchmarks/request_counts.py``) and every
    operation's latency behind a 20 ms proxy (``benchmarks/latency.py``), both written to
    docs/requests.md; then memory recall by meaning (``benchmarks/recall.py``: recall@5 and
    MRR per search mode on WordNet glosses, search latency at 1k-100k passages) and the
    requests of the admin walks over 1k and 10k scopes (``benchmarks/scope_walk.py``) and of
    one owner's session listing among 1k and 10k sessions (``benchmarks/catalog.py``) and
    forks of sessions with 10 and 10,000 messages (``benchmarks/forks.py``), added to
    docs/benchmarks.md; and Pydantic AI's ConversationStore on every backend
    (``benchmarks/conversations.py``: requests of load, save, fork and list, fork bytes,
    turn time beside the session store and ``InMemoryConversationStore``), added to
    docs/benchmarks.md and docs/requests.md. The emulators' resident memory is watched
    meanwhile (the run stops above a bound: ``scripts/servers/watch.py``) and their peaks
    printed and written in docs/benchmarks.md's header. ``-- --quick``: short, nothing
    written."""
    _install(session)
    quick = ["--quick"] if "--quick" in session.posargs else []
    venv = Path(".nox/bench-anchors")
    python = str(venv / "bin" / "python")
    if not venv.exists():
        session.run("uv", "venv", "-q", "-p", BENCH_PYTHON, str(venv), external=True)
    session.run(
        "uv",
        "pip",
        "install",
        "-q",
        "--python",
        python,
        "-r",
        "benchmarks/requirements-anchors.txt",
        "-e",
        "packages/core[harness]",
        "-e",
        "packages/redis[hiredis]",
        "-e",
        "packages/postgres",
        external=True,
    )
    args = [a for a in session.posargs if a != "--quick"]
    # Server URLs go through the environment, not argv: nox echoes every command line,
    # and a URL may carry a key (the Cosmos test server's).
    env: dict[str, str] = {}
    # The servers' memory watches (scripts/servers/watch.py) this session starts.
    watch = _server_module("watch")
    assert watch is not None
    watched_before = len(watch.WATCHES)
    with contextlib.ExitStack() as stack:
        for name in ("redis", "postgres", "dynamodb", "cosmos", "firestore"):
            available, urls = BACKENDS[name]
            server = _server_module(name) if name == "postgres" else None
            if server is not None and server.machine_server_available():
                # Durable commits, as in production: a throwaway cluster runs with fsync
                # off, which hides exactly what one-commit writes save.
                found = stack.enter_context(server.postgres_server(throwaway=False))
            elif available():
                found = stack.enter_context(urls())
            else:
                session.warn(f"no {name} server here: skipping its rows")
                continue
            env[f"AGENT_STORES_BENCH_{name.upper()}"] = found[name]
            if "pgvector" in found:
                env["AGENT_STORES_BENCH_PGVECTOR"] = found["pgvector"]
        for watched in watch.WATCHES[watched_before:]:
            bound = f"{watched.limit_mb:,} MB" if watched.limit_mb else "none"
            session.log(f"{watched.name}: resident memory watched, bound {bound}")

        def print_peaks(failed: type[BaseException] | None, *_: object) -> bool:
            # On the way out, failed or not (before the servers stop); the page only after
            # a whole run, which wrote it.
            page = None if quick or failed else ROOT / "docs" / "benchmarks.md"
            _bench_server_peaks(session, watch.peaks_line(watch.WATCHES[watched_before:]), page)
            return False

        stack.push(print_peaks)
        markdown = [] if quick else ["--markdown", "docs/benchmarks.md"]
        session.run(python, "benchmarks/side_by_side.py", *quick, *markdown, external=True, env=env)
        session.run("python", "benchmarks/run.py", *quick, *args, env=env)
        pages = [] if quick else ["--markdown", "docs/requests.md"]
        session.run("python", "benchmarks/request_counts.py", *pages, env=env)
        samples = ["--samples", "5"] if quick else []
        session.run("python", "benchmarks/latency.py", *samples, *pages, env=env)
        # Written after side_by_side.py, which rewrites docs/benchmarks.md whole.
        recall_page = [] if quick else ["--markdown", "docs/benchmarks.md"]
        session.run("python", "benchmarks/recall.py", *quick, *recall_page, env=env)
        session.run("python", "benchmarks/scope_walk.py", *quick, *recall_page, env=env)
        session.run("python", "benchmarks/catalog.py", *quick, *recall_page, env=env)
        session.run("python", "benchmarks/forks.py", *quick, *recall_page, env=env)
        conversation_pages = [] if quick else [*recall_page, "--markdown", "docs/requests.md"]
        session.run("python", "benchmarks/conversations.py", *quick, *conversation_pages, env=env)


#: The line of docs/benchmarks.md's header saying the test servers' peak memory.
SERVER_PEAKS_PREFIX = "Test servers' peak resident memory"


def _bench_server_peaks(session: nox.Session, line: str, page: Path | None) -> None:
    """Print ``line``, the peak resident memory of the servers the bench started (each one
    watched by ``scripts/servers/watch.py``: above its bound the run stops) and, given
    ``page``, put it in the page's header, under its load average line."""
    if not line:
        return
    session.log(line)
    if page is None or not page.exists():
        return
    lines = [x for x in page.read_text().splitlines() if not x.startswith(SERVER_PEAKS_PREFIX)]
    at = next((i + 1 for i, x in enumerate(lines) if x.startswith("Load average")), 3)
    lines.insert(at, line)
    page.write_text("\n".join(lines) + "\n")


@nox.session(name="contract-stress", python=False)
def contract_stress(session: nox.Session) -> None:
    """The contract N times per backend while busy loops load every core; failures counted.

    ``-- [--runs N] [BACKEND ...] [-- PYTEST_ARGS]`` (default: 20 runs on sqlite and redis).
    Each run is ``nox -s contract -- BACKEND``; logs and report.json / report.md go to
    .nox/contract-stress/ (``--report DIR``). See scripts/stress_contract.py.
    """
    session.run(
        sys.executable,
        str(ROOT / "scripts" / "stress_contract.py"),
        *session.posargs,
        external=True,
    )

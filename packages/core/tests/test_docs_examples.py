"""Every ```python block of README.md and docs/*.md runs, adapted the way a reader would.

The rules (also in docs/design.md, "The examples in the docs run"):

* The blocks of one page run in order, in one namespace, on one event loop, with a fresh
  temporary working directory (``sqlite:///agent.db`` lands there). Top-level ``await`` is
  allowed; a top-level ``asyncio.run(main())`` statement runs as ``await main()`` on the
  page's loop.
* The namespace starts with a prelude, closed after the page: ``model`` (the
  ``TestModel`` below), ``agent`` (an ``Agent`` on it), ``sessions``, ``memory`` and
  ``checkpointer`` (open on a fresh ``memory://`` URL) and ``run_id``. When a block rebinds
  one of those three names to a store it has closed already (a first example's
  ``async with open_checkpointer(…) as checkpointer:``), the name gets the prelude's open
  store back, so the fragments after it find an open one. cosmos.md also gets ``endpoint``
  and ``credential`` (the Cosmos test server's), and firestore.md runs with
  ``FIRESTORE_EMULATOR_HOST`` set to the test emulator (the environment is restored after
  each page).
* A store URL string literal whose scheme has a test server (``redis://``,
  ``redis+cluster://``, ``postgresql://``, ``dynamodb://``, ``cosmos://``,
  ``firestore://``) becomes that server's URL from ``AGENT_STORES_TEST_<NAME>_URL`` (set by
  nox and printed by ``scripts/servers/<name>.py start``) with a fresh ``prefix`` (``schema``
  on PostgreSQL); the literal's other options are kept. A literal given straight to a
  driver (``Redis.from_url``, ``AsyncConnectionPool``, ``AsyncConnection.connect``) becomes
  the bare server address, without the agent-stores options. A ``prefix=`` / ``schema=``
  keyword of ``connect()`` / ``open_*()`` gets a fresh value too.
* A model name literal (``"openai-responses:…"``, ``"anthropic:…"``, …) becomes
  ``TestModel(call_tools=[])``: a plain answer, where a bare ``TestModel`` would call every
  tool with made-up arguments (reading memory files that do not exist).
* A block needing a server whose variable is unset is skipped locally; under CI
  (``CI=true``) or ``nox -s tests`` that is a failure.
* A block importing a module that cannot be installed everywhere (``synaptum``: Python
  >= 3.13) is skipped where it is missing; ``nox -s synaptum`` runs it.
* ``<!-- not-run: reason -->`` on the line before a fence leaves that block out; the
  reason is mandatory (``test_not_run_blocks_give_a_reason``).
* Every page's first example opens and closes its stores with ``async with``
  (``test_first_example_opens_stores_with_async_with``).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import importlib
import importlib.util
import os
import re
import sys
import textwrap
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")
NOT_RUN = re.compile(r"<!--\s*not-run\b:?(?P<reason>.*?)-->")

# scheme -> the environment variable naming its test server (set by nox, see noxfile.py)
SERVER_ENV = {
    "redis": "AGENT_STORES_TEST_REDIS_URL",
    "rediss": "AGENT_STORES_TEST_REDIS_URL",
    "redis+cluster": "AGENT_STORES_TEST_REDIS_CLUSTER_URL",
    "postgresql": "AGENT_STORES_TEST_POSTGRES_URL",
    "postgres": "AGENT_STORES_TEST_POSTGRES_URL",
    "dynamodb": "AGENT_STORES_TEST_DYNAMODB_URL",
    "cosmos": "AGENT_STORES_TEST_COSMOS_URL",
    "firestore": "AGENT_STORES_TEST_FIRESTORE_URL",
}
# Options of a literal that name where (or as whom) to connect: the test server's win.
LOCATION_OPTIONS = {
    "prefix",
    "schema",
    "key",
    "credential",
    "password",
    "region",
    "endpoint_url",
    "emulator",
    "emulator_host",
    "tls",
    "project",
}
# Calls taking a driver's own URL (no agent-stores options in it).
DRIVER_CALLS = {"from_url", "AsyncConnectionPool", "ConnectionPool", "AsyncConnection.connect"}
# Calls of agent-stores whose ``prefix=`` / ``schema=`` keyword gets a fresh value too.
STORE_CALLS = {"connect", "open_sessions", "open_memory", "open_checkpointer", "open_kv"}
ISOLATION_KEYWORDS = {"prefix", "schema"}
MODEL_PROVIDERS = (
    "openai",
    "openai-responses",
    "openai-chat",
    "anthropic",
    "google-gla",
    "google-vertex",
    "groq",
    "mistral",
    "cohere",
    "bedrock",
    "deepseek",
    "grok",
    "gateway",
)
MODEL_NAME = re.compile(rf"^(?:{'|'.join(map(re.escape, MODEL_PROVIDERS))}):\S+$")
TEST_MODEL = "__docs_test_model__"
# A guard against a hung block (a wrong address, a lost server), not a speed assertion.
BLOCK_TIMEOUT = 60.0


@dataclass(frozen=True)
class Block:
    page: str
    number: int  # 1-based among the page's python blocks
    line: int
    source: str
    not_run: str | None  # the reason, when marked <!-- not-run: … -->

    @property
    def id(self) -> str:
        return f"{self.page}:{self.number}"


def _blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        ticks, indent = opening["ticks"], opening["indent"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        if opening["lang"] == "python":
            before = index - 1
            while before >= 0 and not lines[before].strip():
                before -= 1
            marker = NOT_RUN.search(lines[before]) if before >= 0 else None
            body = "\n".join(
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[index + 1 : end]
            )
            found.append(
                Block(
                    page=path.name,
                    number=len(found) + 1,
                    line=index + 1,
                    source=textwrap.dedent(body) + "\n",
                    not_run=marker["reason"].strip() if marker else None,
                )
            )
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in _blocks(page)]
BLOCKS_BY_PAGE: dict[str, list[Block]] = {}
for _block in ALL_BLOCKS:
    BLOCKS_BY_PAGE.setdefault(_block.page, []).append(_block)


def _strict() -> bool:
    """A missing test server fails under CI or ``nox -s tests`` instead of skipping."""
    return os.environ.get("CI", "").lower() in {"1", "true"} or bool(
        os.environ.get("NOX_CURRENT_SESSION")
    )


class MissingServer(Exception):
    """A block names a store whose test server is not configured here."""


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = _call_name(func.value)
        return f"{inner}.{func.attr}" if inner else func.attr
    return ""


def _is_store_call(call: ast.Call) -> bool:
    """``connect(…)`` / ``agent_stores.open_sessions(…)``, not ``sqlite3.connect(…)``."""
    name = _call_name(call.func).removeprefix("agent_stores.")
    return name in STORE_CALLS


def _is_driver_call(call: ast.Call) -> bool:
    name = _call_name(call.func)
    return any(name == known or name.endswith(f".{known}") for known in DRIVER_CALLS)


def _server_url(env: str) -> str:
    server = os.environ.get(env)
    if not server:
        name = env.removeprefix("AGENT_STORES_TEST_").removesuffix("_URL").lower()
        script = name.split("_")[0]
        raise MissingServer(f"{env} is not set (python scripts/servers/{script}.py start)")
    return server


def _fresh_server_url(literal: str, *, bare: bool) -> str:
    env = SERVER_ENV[literal.split("://", 1)[0].lower()]
    server = _server_url(env)
    parts = urllib.parse.urlsplit(server)
    if bare:
        return urllib.parse.urlunsplit(parts._replace(query=""))
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    for name, value in urllib.parse.parse_qsl(
        urllib.parse.urlsplit(literal.replace("…", "x")).query, keep_blank_values=True
    ):
        if name not in LOCATION_OPTIONS and name not in options:
            options[name] = value
    fresh = uuid.uuid4().hex[:10]
    if env.endswith("POSTGRES_URL"):
        options["schema"] = f"docs_{fresh}"
    else:
        options["prefix"] = f"docs-{fresh}"
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(options)))


def _options(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def _cosmos_names() -> dict[str, Any]:
    """``endpoint`` and ``credential`` of cosmos.md's ready-client example."""
    url = _server_url("AGENT_STORES_TEST_COSMOS_URL")
    options = _options(url)
    scheme = "http" if options.get("tls") == "false" else "https"
    return {
        "endpoint": f"{scheme}://{urllib.parse.urlsplit(url).netloc}/",
        "credential": options["key"],
    }


def _firestore_names() -> dict[str, Any]:
    """firestore.md's ready ``AsyncClient`` finds the emulator the way Google's SDK does."""
    url = _server_url("AGENT_STORES_TEST_FIRESTORE_URL")
    os.environ["FIRESTORE_EMULATOR_HOST"] = _options(url)["emulator_host"]
    return {}


# page -> names (or environment) its fragments assume beyond the common prelude
PAGE_PRELUDES = {"cosmos.md": _cosmos_names, "firestore.md": _firestore_names}


class _Adapt(ast.NodeTransformer):
    """The reader's edits: test servers for store URLs, TestModel for model names."""

    def __init__(self) -> None:
        self.driver_literals: set[int] = set()

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _is_driver_call(node):
            self.driver_literals.update(id(arg) for arg in node.args)
        elif _is_store_call(node):
            for keyword in node.keywords:
                if keyword.arg in ISOLATION_KEYWORDS and isinstance(keyword.value, ast.Constant):
                    fresh = uuid.uuid4().hex[:10]
                    keyword.value = ast.Constant(f"docs_{fresh}")
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        value = node.value
        if not isinstance(value, str):
            return node
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme in SERVER_ENV:
            url = _fresh_server_url(value, bare=id(node) in self.driver_literals)
            return ast.copy_location(ast.Constant(url), node)
        if MODEL_NAME.match(value):
            call = ast.Call(ast.Name(TEST_MODEL, ast.Load()), [], [])
            return ast.copy_location(call, node)
        return node


def _compile(block: Block) -> CodeType:
    tree = ast.parse(block.source, filename=block.id)
    for statement in tree.body:
        # A top-level ``asyncio.run(x)`` runs as ``await x`` on the page's loop.
        value = statement.value if isinstance(statement, ast.Expr) else None
        if (
            isinstance(value, ast.Call)
            and _call_name(value.func) == "asyncio.run"
            and len(value.args) == 1
        ):
            assert isinstance(statement, ast.Expr)
            statement.value = ast.copy_location(ast.Await(value.args[0]), value)
    adapted = ast.fix_missing_locations(_Adapt().visit(tree))
    code: CodeType = compile(adapted, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return code


# Modules a block may need that cannot be installed everywhere: the block alone is skipped
# where they are missing (the page goes on), and the named session runs it.
OPTIONAL_MODULES = {
    "synaptum": "synaptum needs Python >= 3.13; nox -s synaptum runs this block",
}


def _missing_optional_module(block: Block) -> str | None:
    for node in ast.walk(ast.parse(block.source)):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            top = name.partition(".")[0]
            if top in OPTIONAL_MODULES and importlib.util.find_spec(top) is None:
                return OPTIONAL_MODULES[top]
    return None


# OpenTelemetry's global providers can be set once per process; a page that sets them
# (observability.md) must not leave its console exporters to the test modules after it.
OTEL_GLOBALS = {
    "opentelemetry.trace": ("_TRACER_PROVIDER", "_TRACER_PROVIDER_SET_ONCE"),
    "opentelemetry.metrics._internal": ("_METER_PROVIDER", "_METER_PROVIDER_SET_ONCE"),
}


def _otel_globals() -> dict[tuple[str, str], Any]:
    saved: dict[tuple[str, str], Any] = {}
    for module_name, names in OTEL_GLOBALS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        provider, once = (getattr(module, name) for name in names)
        saved[module_name, names[0]] = provider
        saved[module_name, names[1]] = (type(once), once._done)
    return saved


def _restore_otel_globals(saved: dict[tuple[str, str], Any]) -> None:
    for (module_name, name), value in saved.items():
        if name.endswith("_ONCE"):
            once_type, done = value
            value = once_type()  # unfired unless it had fired before the page
            if done:
                value.do_once(lambda: None)
        setattr(importlib.import_module(module_name), name, value)
    # agent-stores caches its instruments; ones made while the page's provider was global
    # would stay bound to it (proxies made before would rebind to the next provider).
    from agent_stores import telemetry

    telemetry._instruments.cache_clear()


@dataclass
class Page:
    """One page's namespace, event loop, working directory and prelude stores."""

    name: str
    directory: Path
    runner: asyncio.Runner = field(default_factory=asyncio.Runner)
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    module: ModuleType = field(init=False)
    ready: bool = False  # the prelude ran
    done: int = 0  # blocks run so far
    failed: str | None = None  # why the page cannot go on
    skipped: bool = False  # ``failed`` is a missing server, not an error
    closed: bool = False
    prelude_stores: dict[str, Any] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    otel: dict[tuple[str, str], Any] = field(default_factory=_otel_globals)

    def __post_init__(self) -> None:
        # A real module: dataclasses, pickling and typing look classes up by module name.
        self.module = ModuleType("_docs_" + re.sub(r"\W", "_", self.name))

    @property
    def namespace(self) -> dict[str, Any]:
        return self.module.__dict__

    async def _prelude(self) -> None:
        from agent_stores import open_checkpointer, open_memory, open_sessions
        from pydantic_ai import Agent
        from pydantic_ai.models.test import TestModel

        url = f"memory://docs-{uuid.uuid4().hex[:10]}"
        model = TestModel(call_tools=[])
        self.prelude_stores = {
            "sessions": await self.stack.enter_async_context(open_sessions(url)),
            "memory": await self.stack.enter_async_context(open_memory(url)),
            "checkpointer": await self.stack.enter_async_context(open_checkpointer(url)),
        }
        self.namespace.update(self.prelude_stores, model=model, agent=Agent(model), run_id="run-1")
        sys.modules[self.module.__name__] = self.module
        extra = PAGE_PRELUDES.get(self.name)
        if extra is not None:
            self.namespace.update(extra())
        self.namespace[TEST_MODEL] = functools.partial(TestModel, call_tools=[])

    def run(self, block: Block) -> None:
        with contextlib.chdir(self.directory):
            if not self.ready:
                self.ready = True
                self.runner.run(self._prelude())
            code = _compile(block)
            result = eval(code, self.namespace)
            if asyncio.iscoroutine(result):
                self.runner.run(asyncio.wait_for(result, BLOCK_TIMEOUT))
        for name, store in self.prelude_stores.items():
            rebound = self.namespace.get(name)
            if rebound is not store and getattr(getattr(rebound, "kv", None), "closed", False):
                self.namespace[name] = store

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.ready:
                with contextlib.chdir(self.directory):
                    self.runner.run(asyncio.wait_for(self.stack.aclose(), BLOCK_TIMEOUT))
        finally:
            sys.modules.pop(self.module.__name__, None)
            self.runner.close()
            # A page may set variables (credentials, emulator hosts): none leaks to the next.
            os.environ.clear()
            os.environ.update(self.environ)
            _restore_otel_globals(self.otel)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Page]]:
    opened: dict[str, Page] = {}

    class Pages(dict[str, Page]):
        def __missing__(self, name: str) -> Page:
            page = Page(name, tmp_path_factory.mktemp(name.replace(".", "-")))
            self[name] = page
            opened[name] = page
            return page

    yield Pages()
    for page in opened.values():
        page.close()


def _stop_if_failed(page: Page) -> None:
    if page.failed is None:
        return
    if page.skipped:
        pytest.skip(f"not run: {page.failed}")
    pytest.fail(f"not run: {page.failed}")


def _run_through(page: Page, block: Block) -> None:
    """Run the page's blocks up to ``block`` (earlier ones first, when selected alone)."""
    for earlier in BLOCKS_BY_PAGE[block.page][page.done : block.number]:
        _stop_if_failed(page)
        page.done = earlier.number
        if earlier.not_run is not None:
            continue
        missing = _missing_optional_module(earlier)
        if missing is not None:
            if earlier is block:
                pytest.skip(missing)
            continue
        try:
            page.run(earlier)
        except MissingServer as exc:
            page.failed = f"{earlier.id} needs a test server: {exc}"
            page.skipped = not _strict()
            if _strict():
                pytest.fail(page.failed)
            pytest.skip(page.failed)
        except BaseException as exc:
            page.failed = f"{earlier.id} failed ({type(exc).__name__}: {exc})"
            raise


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS], ids=[b.id for b in ALL_BLOCKS])
def test_docs_block_runs(block: Block, pages: dict[str, Page]) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked not-run: {block.not_run}")
    page = pages[block.page]
    if page.done >= block.number:
        _stop_if_failed(page)
    try:
        _run_through(page, block)
    finally:
        if block.number == len(BLOCKS_BY_PAGE[block.page]) or page.failed is not None:
            page.close()


def test_not_run_blocks_give_a_reason() -> None:
    """The escape hatch is listed here and must say why."""
    not_run = {block.id: block.not_run for block in ALL_BLOCKS if block.not_run is not None}
    assert all(reason for reason in not_run.values()), not_run
    print("blocks not run:", not_run)


def test_blocks_are_collected() -> None:
    assert "README.md:1" in {block.id for block in ALL_BLOCKS}
    assert len(ALL_BLOCKS) > 20


def _stores_opened_outside_async_with(source: str) -> list[str]:
    """Calls of ``connect``/``open_*`` that are not the context of an ``async with``."""
    tree = ast.parse(source)
    managed = {
        id(item.context_expr)
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncWith)
        for item in node.items
    }
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and not _is_driver_call(node)
        and _is_store_call(node)
        and id(node) not in managed
    ]


@pytest.mark.parametrize("page", sorted(BLOCKS_BY_PAGE), ids=lambda page: f"{page}-first-example")
def test_first_example_opens_stores_with_async_with(page: str) -> None:
    """Every page's first example opens and closes its stores the same way."""
    first = next(block for block in BLOCKS_BY_PAGE[page] if block.not_run is None)
    assert _stores_opened_outside_async_with(first.source) == [], first.id

"""A private Cosmos DB test server: npm ``@vercel/cosmosdb-server`` run with Node on loopback.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. The server is installed with the machine's ``npm`` into a cache folder
(``$AGENT_STORES_COSMOS_SERVER_DIR``, else ``~/.cache/agent-stores/cosmosdb-server``) the
first time it is needed, then started as ``node …/cli.js -p 0 --no-ssl --host 127.0.0.1``:
the server binds a port the kernel picks and prints it, so two runs on one machine can
never be handed the same port. It keeps everything in memory: stopping it erases the data.

The cache folder is shared by every checkout and CI run on the machine, so installing is
safe to run concurrently: it holds ``flock`` on ``install.lock`` in that folder, installs
into a private temporary folder beside the final one and renames it into place (a reader
sees either no install or a complete one), and when npm fails the error carries only the
last lines of npm's output and names the file holding the whole log.

That server is not Azure Cosmos DB. Its known gaps (see ``docs/cosmos.md``): batches are
not atomic, no ``OFFSET/LIMIT``, queries ignore the partition key header, a point read of
a missing item answers 500 unless the request carries the cross-partition header, TTL
never deletes. The URLs this script hands out therefore carry ``emulator=cosmosdb-server``,
which makes the backend work around the 500 and declare ``commit`` unsupported.

As a library (load it by path)::

    with cosmos_server() as urls:
        urls["cosmos"]   # cosmos://127.0.0.1:P/agent-stores-test/kv?tls=false&emulator=…

As a command (state kept in ``.servers/cosmos/`` at the repository root)::

    python scripts/servers/cosmos.py start   # prints AGENT_STORES_TEST_COSMOS_URL=…
    python scripts/servers/cosmos.py urls
    python scripts/servers/cosmos.py stop
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

URL_ENV = "AGENT_STORES_TEST_COSMOS_URL"
DIR_ENV = "AGENT_STORES_COSMOS_SERVER_DIR"
PACKAGE = "@vercel/cosmosdb-server@1.0.1"
#: Another npm spec of the same package (a mirror's tarball, a local ``.tgz``) to install
#: instead of :data:`PACKAGE`.
PACKAGE_ENV = "AGENT_STORES_COSMOS_SERVER_PACKAGE"
LOCK_NAME = "install.lock"
#: Leftovers of an install that was killed start with this (removed under the lock).
PARTIAL_PREFIX = ".partial-"
#: Lines of npm's output an install error carries (the whole log goes to a file).
ERROR_TAIL_LINES = 20
REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".servers" / "cosmos"
HOST = "127.0.0.1"
START_TIMEOUT = 30.0
INSTALL_TIMEOUT = 600.0
MIN_NODE_MAJOR = 18
#: The key of Microsoft's Cosmos DB emulator, published in its documentation. The test
#: server accepts any key; this one is public, so it is no secret in a test URL.
EMULATOR_KEY = (
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
)
#: How the memory watch names the server.
WATCHED_NAME = "cosmosdb-server (the Cosmos DB test server)"
DATABASE = "agent-stores-test"
CONTAINER = "kv"


class ServerError(RuntimeError):
    """The server could not be installed, started or stopped."""


def _watch() -> ModuleType:
    """``watch.py`` beside this script (loaded by path under one name, as nox loads it)."""
    name = "agent_stores_servers_watch"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("watch.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


#: What ``cli.js`` prints once it listens (it prints the port it got, also for ``-p 0``).
_READY_RE = re.compile(r"Ready to accept HTTPS? connections at \S+:(\d+)")


def install_dir() -> Path:
    """Where the npm package is installed (created on demand)."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "agent-stores" / "cosmosdb-server"


def package_spec() -> str:
    """The npm spec installed: ``$AGENT_STORES_COSMOS_SERVER_PACKAGE``, else :data:`PACKAGE`."""
    return os.environ.get(PACKAGE_ENV) or PACKAGE


def installed_folder(spec: str | None = None) -> Path:
    """The folder inside :func:`install_dir` that holds the install of ``spec``.

    One folder per spec, so changing the spec never reuses (or half-overwrites) another.
    """
    spec = spec or package_spec()
    readable = re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")[:60] or "package"
    digest = hashlib.sha256(spec.encode("utf-8")).hexdigest()[:10]
    return install_dir() / f"{readable}-{digest}"


def _cli_path(folder: Path) -> Path:
    return folder / "node_modules" / "@vercel" / "cosmosdb-server" / "lib" / "cli.js"


def _node_major(node: str) -> int | None:
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        return int(out.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _missing_runtime() -> str | None:
    """Why Node.js/npm cannot run the server here, or None when they can."""
    node = shutil.which("node")
    if node is None:
        return (
            f"the Cosmos test server needs Node.js >= {MIN_NODE_MAJOR} and npm "
            "(Debian: apt-get install nodejs npm); `node` is not on PATH"
        )
    major = _node_major(node)
    if major is None or major < MIN_NODE_MAJOR:
        return (
            f"the Cosmos test server needs Node.js >= {MIN_NODE_MAJOR}; "
            f"found {node} (major version {major})"
        )
    if not _cli_path(installed_folder()).exists() and shutil.which("npm") is None:
        return (
            f"the Cosmos test server is installed with npm (npm install {package_spec()}); "
            "`npm` is not on PATH (Debian: apt-get install npm)"
        )
    return None


def available() -> bool:
    """True when Node.js >= 18 is present and the server is installed or npm can install it."""
    return _missing_runtime() is None


def ensure_installed() -> Path:
    """Install the npm package unless it is installed; returns its ``cli.js``.

    Safe to call from several processes at once on one cache folder (see the module doc).
    """
    problem = _missing_runtime()
    if problem is not None:
        raise ServerError(problem)
    spec = package_spec()
    target = installed_folder(spec)
    cli = _cli_path(target)
    if cli.exists():
        return cli
    cache = install_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with _install_lock(cache):
        if not cli.exists():  # else another process installed it while we waited
            _install(spec, cache, target)
    return cli


@contextlib.contextmanager
def _install_lock(cache: Path) -> Iterator[None]:
    """Hold ``flock`` on the cache folder's lock file (waits for another installer)."""
    path = cache / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # A bounded wait: an installer that hangs must not block every later run forever.
        deadline = time.monotonic() + INSTALL_TIMEOUT + 60
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"another process has held {path} for over {INSTALL_TIMEOUT + 60:.0f} s "
                        "(a hung npm install?); stop it, or set "
                        f"${DIR_ENV} to another folder"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def _install(spec: str, cache: Path, target: Path) -> None:
    """``npm install spec`` into a temporary folder, renamed to ``target`` once complete.

    Call it holding the lock: any partial folder left in ``cache`` is then a dead one's.
    """
    for stale in cache.glob(f"{PARTIAL_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    npm = shutil.which("npm")
    assert npm is not None
    work = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=cache))
    work.chmod(0o755)  # mkdtemp's 0700 would hide the install from other users of the cache
    argv = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(work), spec]
    try:
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # one stream, in the order npm wrote it
                check=False,
                timeout=INSTALL_TIMEOUT,
            )
            output = result.stdout.decode("utf-8", "replace")
            failure = None if result.returncode == 0 else f"exited with {result.returncode}"
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode("utf-8", "replace")
            failure = f"did not finish within {INSTALL_TIMEOUT:.0f} s"
        if failure is None and not _cli_path(work).exists():
            failure = f"finished, but {_cli_path(work).relative_to(work)} is missing"
        if failure is not None:
            log = _write_log(cache, argv, failure, output)
            raise ServerError(install_error(spec, cache, failure, output, log))
        if target.exists():
            # An earlier install without cli.js (damaged by hand): move it out of the way.
            trash = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=cache))
            os.rename(target, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(work, target)  # atomic: readers see no install or a whole one
    finally:
        shutil.rmtree(work, ignore_errors=True)  # nothing left there after the rename


def _write_log(cache: Path, argv: list[str], failure: str, output: str) -> Path:
    fd, name = tempfile.mkstemp(prefix="npm-install-failed-", suffix=".log", dir=cache)
    with os.fdopen(fd, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n# {failure}\n{output}")
    return Path(name)


def install_error(spec: str, cache: Path, failure: str, output: str, log: Path) -> str:
    """The message of a failed install: the last lines of npm's output, and the log's path."""
    lines = [line[:300] for line in output.rstrip().splitlines()[-ERROR_TAIL_LINES:]]
    tail = "\n".join(f"  {line}" for line in lines) or "  (no output)"
    return (
        f"npm install {spec} into {cache} failed ({failure}); the last {len(lines)} lines "
        f"of its output:\n{tail}\nthe whole log: {log}"
    )


def free_port() -> int:
    """A free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=1.0) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def url_for(port: int, prefix: str | None = None) -> str:
    """The store URL of a test server on ``port`` (the public emulator key, a unique prefix)."""
    query = urllib.parse.urlencode(
        {
            "tls": "false",
            "emulator": "cosmosdb-server",
            "key": EMULATOR_KEY,
            "prefix": prefix or f"agent-stores-test-{uuid.uuid4().hex[:10]}",
        },
        quote_via=urllib.parse.quote,
        safe="",
    )
    return f"cosmos://{HOST}:{port}/{DATABASE}/{CONTAINER}?{query}"


@dataclass
class CosmosServer:
    """One ``cosmosdb-server`` process on ``127.0.0.1:port`` (``port`` 0: the kernel picks
    one when the server binds; :meth:`start` sets the one it got)."""

    port: int
    logfile: Path
    pid: int | None = None

    def start(self) -> None:
        """Start the process and wait until it listens; never leaves a half-started one.

        Ready means *this* process printed that it listens (then it answers): a server of
        another run answering on the same port must never pass for ours.
        """
        cli = ensure_installed()
        node = shutil.which("node")
        assert node is not None
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as log:
            offset = log.tell()  # the file may hold earlier runs' lines
            proc = subprocess.Popen(
                [node, str(cli), "-p", str(self.port), "--no-ssl", "--host", HOST],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives nothing but its owner; killed by pid
            )
        self.pid = proc.pid
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            port = self._listening_port(offset)
            if port is not None and proc.poll() is None and _answers(port):
                self.port = port
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"cosmosdb-server (asked for port {self.port or 'any'}) did not start; "
                    f"see {self.logfile}"
                )
            time.sleep(0.05)

    def _listening_port(self, offset: int) -> int | None:
        """The port from the server's "Ready to accept HTTP connections at HOST:PORT" line."""
        try:
            with self.logfile.open("rb") as log:
                log.seek(offset)
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return None
        match = _READY_RE.search(text)
        return int(match.group(1)) if match else None

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and wait until it is gone."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _alive(pid):
                return
        raise ServerError(f"cosmosdb-server pid {pid} did not stop")


def _alive(pid: int) -> bool:
    # Reap it if it is our child, so a zombie does not count as alive.
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        with contextlib.suppress(OSError):
            return "\nState:\tZ" not in status.read_text()
    return True


@contextlib.contextmanager
def cosmos_server() -> Iterator[dict[str, str]]:
    """Start a private server, yield ``{"cosmos": url}``, stop it on exit.

    Its resident memory is watched meanwhile (``watch.py``: 4 GB by default,
    ``AGENT_STORES_COSMOS_SERVER_RSS_LIMIT_MB``); above it the server is killed and the
    run stops with :class:`ServerMemoryError`.
    """
    folder = Path(tempfile.mkdtemp(prefix="agent-stores-cosmos-"))
    server = CosmosServer(0, folder / "cosmosdb-server.log")
    try:
        server.start()
        assert server.pid is not None
        # Its resident memory watched: above the bound the run stops (watch.py).
        with _watch().watching(WATCHED_NAME, server.pid, "cosmos"):
            yield {"cosmos": url_for(server.port)}
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def env_for(urls: dict[str, str]) -> dict[str, str]:
    """The environment variable the Cosmos tests read."""
    return {URL_ENV: urls["cosmos"]}


# -- command line ---------------------------------------------------------------------------


def _load_state(state_dir: Path) -> dict[str, object] | None:
    path = state_dir / "state.json"
    if not path.exists():
        return None
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _print(urls: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(urls))
        return
    for name, value in env_for(urls).items():
        print(f"{name}={value}")


def _cli_start(state_dir: Path, as_json: bool) -> int:
    state = _load_state(state_dir)
    if state is not None:
        if _answers(int(str(state["port"]))):
            print("already running", file=sys.stderr)
            _print({"cosmos": str(state["url"])}, as_json)
            return 0
        _cli_stop(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    server = CosmosServer(0, state_dir / "cosmosdb-server.log")
    server.start()
    url = url_for(server.port)
    (state_dir / "state.json").write_text(
        json.dumps({"port": server.port, "pid": server.pid, "url": url}, indent=2)
    )
    _print({"cosmos": url}, as_json)
    return 0


def _cli_stop(state_dir: Path) -> int:
    state = _load_state(state_dir)
    if state is None:
        print("no server recorded", file=sys.stderr)
        return 0
    pid = state.get("pid")
    server = CosmosServer(int(str(state["port"])), state_dir / "cosmosdb-server.log")
    server.pid = int(str(pid)) if pid is not None else None
    server.stop()
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` | ``stop`` | ``urls`` | ``install`` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="scripts/servers/cosmos.py", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "urls", "install"])
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help="where state is kept")
    parser.add_argument("--json", action="store_true", help="print the URLs as JSON")
    args = parser.parse_args(argv)
    try:
        if args.action == "install":
            print(ensure_installed())
            return 0
        if args.action == "start":
            return _cli_start(args.state_dir, args.json)
        if args.action == "stop":
            return _cli_stop(args.state_dir)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = _load_state(args.state_dir)
    if state is None:
        print("not running; use: python scripts/servers/cosmos.py start", file=sys.stderr)
        return 1
    _print({"cosmos": str(state["url"])}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

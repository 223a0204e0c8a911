"""A private Cosmos DB test server: npm ``@vercel/cosmosdb-server`` run with Node on loopback.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. The server is installed with the machine's ``npm`` into a cache folder
(``$AGENT_STORES_COSMOS_SERVER_DIR``, else ``~/.cache/agent-stores/cosmosdb-server``) the
first time it is needed, then started as ``node …/cli.js -p PORT --no-ssl --host 127.0.0.1``
on a free port. It keeps everything in memory: stopping it erases the data.

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
import json
import os
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

URL_ENV = "AGENT_STORES_TEST_COSMOS_URL"
DIR_ENV = "AGENT_STORES_COSMOS_SERVER_DIR"
PACKAGE = "@vercel/cosmosdb-server@1.0.1"
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
DATABASE = "agent-stores-test"
CONTAINER = "kv"


class ServerError(RuntimeError):
    """The server could not be installed, started or stopped."""


def install_dir() -> Path:
    """Where the npm package is installed (created on demand)."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "agent-stores" / "cosmosdb-server"


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
    if not _cli_path(install_dir()).exists() and shutil.which("npm") is None:
        return (
            f"the Cosmos test server is installed with npm (npm install {PACKAGE}); "
            "`npm` is not on PATH (Debian: apt-get install npm)"
        )
    return None


def available() -> bool:
    """True when Node.js >= 18 is present and the server is installed or npm can install it."""
    return _missing_runtime() is None


def ensure_installed() -> Path:
    """Install the npm package into :func:`install_dir` unless it is there; returns ``cli.js``."""
    problem = _missing_runtime()
    if problem is not None:
        raise ServerError(problem)
    folder = install_dir()
    cli = _cli_path(folder)
    if cli.exists():
        return cli
    folder.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    assert npm is not None
    result = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder), PACKAGE],
        capture_output=True,
        text=True,
        check=False,
        timeout=INSTALL_TIMEOUT,
    )
    if result.returncode != 0 or not cli.exists():
        raise ServerError(
            f"npm install {PACKAGE} into {folder} failed:\n{result.stdout}{result.stderr}"
        )
    return cli


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
    """One ``cosmosdb-server`` process on ``127.0.0.1:port``."""

    port: int
    logfile: Path
    pid: int | None = None

    def start(self) -> None:
        """Start the process and wait until it answers; never leaves a half-started one."""
        cli = ensure_installed()
        node = shutil.which("node")
        assert node is not None
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as log:
            proc = subprocess.Popen(
                [node, str(cli), "-p", str(self.port), "--no-ssl", "--host", HOST],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives nothing but its owner; killed by pid
            )
        self.pid = proc.pid
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.port):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"cosmosdb-server on port {self.port} did not answer; see {self.logfile}"
                )
            time.sleep(0.05)

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
    """Start a private server, yield ``{"cosmos": url}``, stop it on exit."""
    folder = Path(tempfile.mkdtemp(prefix="agent-stores-cosmos-"))
    server = CosmosServer(free_port(), folder / "cosmosdb-server.log")
    try:
        server.start()
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
    server = CosmosServer(free_port(), state_dir / "cosmosdb-server.log")
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

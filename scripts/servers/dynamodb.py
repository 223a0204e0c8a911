"""A private DynamoDB server for tests: ``moto_server`` (from ``moto[server]>=5``) on loopback.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. nox runs this file with its own interpreter, outside the project's
venv, so the Python that has ``moto[server]`` is looked for in this order:

1. the running interpreter (``sys.executable``), when it can import moto;
2. the interpreter of a ``moto_server`` next to ``sys.executable``;
3. ``.venv/bin/python`` at the repository root (the uv workspace venv);
4. the interpreter of ``moto_server`` on ``PATH`` (from its ``#!`` line).

None of them: :class:`ServerError` naming ``pip install "moto[server]>=5"``.

moto's conditional writes, TransactWriteItems and Query paging are faithful; its TTL is
accepted but never deletes, which the backend does not need (expiry is enforced on read).
One thing is not: ``moto_server`` serves requests on threads and its DynamoDB model holds
no lock between checking a ConditionExpression and writing, so two concurrent conditional
PutItems on one item can both succeed (seen with moto 5.2.5: two CAS winners on one
version). DynamoDB itself applies each item's writes one at a time. So the script runs
moto's own WSGI app (the app and request handler ``moto_server`` uses) behind one lock:
connections are still read on threads, but requests are handled one at a time, so every
request is atomic, as in DynamoDB.

And one thing makes moto grow without end: every model object it makes (``BaseModel``, each
item among them) is appended to a per-class list for its dashboard
(``moto/core/common_models.py``, ``instances_tracked``) and never dropped, while
``TransactWriteItems`` deep-copies the whole table as a rollback backup before each
transaction (``moto/dynamodb/models/__init__.py``, ``transact_write_items``). So every
transaction kept a copy of every item: moto grew by the table's size per transaction
(4 MB a transaction at 2,000 items, measured) and reached 22 GB in one ``nox -s bench``.
The launcher turns the tracking off (nothing but moto's dashboard and S3 read those lists),
and moto stays at its table's size (95 MB after those 300 transactions). The copies still
cost time: a transaction takes time in proportion to the whole table.

As a library (load it by path)::

    with dynamodb_server() as urls:
        urls["dynamodb"]   # dynamodb://testing:***@agent-stores-test?region=us-east-1&…

As a command (state kept in ``.servers/dynamodb/`` at the repository root)::

    python scripts/servers/dynamodb.py start   # prints AGENT_STORES_TEST_DYNAMODB_URL=…
    python scripts/servers/dynamodb.py urls
    python scripts/servers/dynamodb.py stop

moto accepts any credentials but needs signed requests to route them, so the URL carries
the dummy key ``testing:testing`` in its user-info part, where every printer of store
URLs (StoreURL, nox) masks the secret. Each URL has a unique ``prefix``.
"""

import argparse
import contextlib
import importlib.util
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
from pathlib import Path
from types import ModuleType

URL_ENV = "AGENT_STORES_TEST_DYNAMODB_URL"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".servers" / "dynamodb"
HOST = "127.0.0.1"
START_TIMEOUT = 30.0
TABLE = "agent-stores-test"
REGION = "us-east-1"
#: How the memory watch names the server.
WATCHED_NAME = "moto (the DynamoDB test server)"
INSTALL_HINT = 'pip install "moto[server]>=5" (it is in the workspace dev group: uv sync)'


class ServerError(RuntimeError):
    """The server could not be started or stopped."""


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


# moto_server's own main(), with requests handled under one lock (see the module docstring).
LAUNCHER = """
import signal, sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
try:
    from moto.moto_server.werkzeug_app import MotoRequestHandler as handler
except ImportError:
    handler = None
from moto.core.common_models import BaseModel
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
# No instance tracking (see the module docstring): it kept every item moto ever made.
BaseModel.__new__ = staticmethod(lambda cls, *args, **kwargs: object.__new__(cls))
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()

def serialized(environ, start_response):
    # Connections are read on threads; requests are handled one at a time.
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    import io
    environ["wsgi.input"] = io.BytesIO(body)
    with lock:
        return list(app(environ, start_response))

run_simple(sys.argv[1], int(sys.argv[2]), serialized, threaded=True,
           request_handler=handler)
"""


_CHECK_MOTO = "import moto, moto.server; assert int(moto.__version__.split('.')[0]) >= 5"


def _has_moto(python: str) -> bool:
    try:
        result = subprocess.run(
            [python, "-c", _CHECK_MOTO],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _interpreter_of(script: Path) -> str | None:
    """The Python named on the ``#!`` line of a console script such as ``moto_server``."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline().decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    return parts[0] if parts and Path(parts[0]).is_file() else None


def find_python() -> str | None:
    """A Python interpreter that can import ``moto.server``, or None."""
    candidates: list[str | None] = [sys.executable]
    candidates.append(_interpreter_of(Path(sys.executable).parent / "moto_server"))
    candidates.append(str(REPO_ROOT / ".venv" / "bin" / "python"))
    on_path = shutil.which("moto_server")
    if on_path:
        candidates.append(_interpreter_of(Path(on_path)))
    seen: set[str] = set()
    for candidate in candidates:
        if not candidate or candidate in seen or not Path(candidate).exists():
            continue
        seen.add(candidate)
        if _has_moto(candidate):
            return candidate
    return None


def server_command() -> list[str] | None:
    """The command line (without host and port) that runs moto's server here, or None."""
    python = find_python()
    return None if python is None else [python, "-c", LAUNCHER]


def available() -> bool:
    """True when moto's server can be started here."""
    return find_python() is not None


def free_port() -> int:
    """A free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    # moto's own management API; any HTTP answer means the server is up.
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/moto-api/", timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
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


def stop_pid(pid: int) -> None:
    """Stop the server's process group (SIGTERM, then SIGKILL) and wait until it is gone."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        if not _alive(pid):
            return
    raise ServerError(f"moto_server pid {pid} did not stop")


def make_url(port: int, prefix: str | None = None) -> str:
    """The store URL for a moto server on ``port`` (dummy credentials, fresh prefix)."""
    query = urllib.parse.urlencode(
        {
            "region": REGION,
            "endpoint_url": f"http://{HOST}:{port}",
            "prefix": prefix or f"agent-stores-test-{uuid.uuid4().hex[:10]}",
        }
    )
    return f"dynamodb://testing:testing@{TABLE}?{query}"


def start_server(log_path: Path) -> tuple[int, int]:
    """Start moto's server on a free port; returns ``(pid, port)``. Never leaks a process."""
    command = server_command()
    if command is None:
        raise ServerError(f"moto's DynamoDB server is not installed: {INSTALL_HINT}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):
        port = free_port()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [*command, HOST, str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not _answers(port):
                if process.poll() is not None:
                    break  # port taken in between, most likely: try another one
                if time.monotonic() > deadline:
                    raise ServerError(f"moto_server on port {port} did not answer; see {log_path}")
                time.sleep(0.1)
            else:
                return process.pid, port
        except BaseException:
            stop_pid(process.pid)
            raise
        stop_pid(process.pid)
    raise ServerError(f"moto_server would not start; see {log_path}")


@contextlib.contextmanager
def dynamodb_server() -> Iterator[dict[str, str]]:
    """Start a private moto server, yield ``{"dynamodb": url}``, stop it on exit.

    Its resident memory is watched meanwhile (``watch.py``: 4 GB by default,
    ``AGENT_STORES_DYNAMODB_SERVER_RSS_LIMIT_MB``); above it the server is killed and the
    run stops with :class:`ServerMemoryError`.
    """
    directory = Path(tempfile.mkdtemp(prefix="agent-stores-dynamodb-"))
    try:
        pid, port = start_server(directory / "moto.log")
        try:
            # Its resident memory watched: above the bound the run stops (watch.py).
            with _watch().watching(WATCHED_NAME, pid, "dynamodb"):
                yield {"dynamodb": make_url(port)}
        finally:
            stop_pid(pid)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def env_for(urls: dict[str, str]) -> dict[str, str]:
    """The environment variable the DynamoDB tests read."""
    return {URL_ENV: urls["dynamodb"]}


# -- command line -------------------------------------------------------------------------


def _load_state(state_dir: Path) -> dict[str, object] | None:
    path = state_dir / "state.json"
    if not path.exists():
        return None
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _print_urls(urls: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(urls))
        return
    for name, value in env_for(urls).items():
        print(f"{name}={value}")


def _cli_start(state_dir: Path, as_json: bool) -> int:
    state = _load_state(state_dir)
    if state is not None:
        urls = state["urls"]
        assert isinstance(urls, dict)
        if _answers(int(str(state["port"]))):
            print("already running", file=sys.stderr)
            _print_urls(urls, as_json)
            return 0
        _cli_stop(state_dir)
    pid, port = start_server(state_dir / "moto.log")
    urls = {"dynamodb": make_url(port)}
    (state_dir / "state.json").write_text(
        json.dumps({"pid": pid, "port": port, "urls": urls}, indent=2)
    )
    _print_urls(urls, as_json)
    return 0


def _cli_stop(state_dir: Path) -> int:
    state = _load_state(state_dir)
    if state is None:
        print("no server recorded", file=sys.stderr)
        return 0
    stop_pid(int(str(state["pid"])))
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` | ``stop`` | ``urls`` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="scripts/servers/dynamodb.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "urls"])
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help="where state is kept")
    parser.add_argument("--json", action="store_true", help="print the URLs as JSON")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            return _cli_start(args.state_dir, args.json)
        if args.action == "stop":
            return _cli_stop(args.state_dir)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = _load_state(args.state_dir)
    if state is None:
        print("not running; use: python scripts/servers/dynamodb.py start", file=sys.stderr)
        return 1
    urls = state["urls"]
    assert isinstance(urls, dict)
    _print_urls(urls, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

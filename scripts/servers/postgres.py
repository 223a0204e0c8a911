"""Real PostgreSQL servers for tests: a fresh database, or a throwaway cluster.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. Tests never touch the machine's own databases:

* by default a throwaway cluster: ``initdb`` (as user ``postgres`` when running as root,
  which initdb refuses to be) in a temporary directory, started with ``pg_ctl`` on a free
  loopback port with ``fsync=off``, stopped and deleted on exit. Tests that must restart
  a server (``Cluster.restart()``) always use one of these;
* only when asked (``postgres_server(throwaway=False)``, ``start --machine``), a freshly
  created database with a unique name on the machine's PostgreSQL on 127.0.0.1:5432
  (trust auth), dropped (``WITH (FORCE)``) on exit.

:func:`available` says whether the server binaries are here; :func:`missing` names what
to install when they are not.

As a library (load it by path)::

    with postgres_server() as urls:
        urls["postgres"]        # postgresql://postgres@127.0.0.1:P/postgres (throwaway)

    with throwaway_cluster() as cluster:
        cluster.url()           # postgresql://postgres@127.0.0.1:P/postgres
        cluster.restart()

As a command (state kept in ``.servers/postgres/`` at the repository root)::

    python scripts/servers/postgres.py start [--machine]     # prints the export line
    python scripts/servers/postgres.py start --pgvector      # PostgreSQL 16 with pgvector
    python scripts/servers/postgres.py url                   # AGENT_STORES_TEST_POSTGRES_URL=…
    python scripts/servers/postgres.py stop
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "AGENT_STORES_TEST_POSTGRES_URL"
PGVECTOR_URL_ENV = "AGENT_STORES_TEST_PGVECTOR_URL"
BIN_ENV = "AGENT_STORES_PG_BIN"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".servers" / "postgres"
HOST = "127.0.0.1"
MACHINE_PORT = 5432
SUPERUSER = "postgres"
START_TIMEOUT = 60


class ServerError(RuntimeError):
    """A server could not be started, reached or stopped."""


# -- binaries and psql --------------------------------------------------------------------


def pg_bin(name: str) -> str:
    """Path of a PostgreSQL server binary (``$AGENT_STORES_PG_BIN``, else the newest Debian install)."""
    configured = os.environ.get(BIN_ENV)
    candidates = [configured] if configured else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    for directory in candidates:
        path = Path(directory) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    raise ServerError(f"{name} not found (set {BIN_ENV} to PostgreSQL's bin directory)")


def psql(sql: str, *, host: str = HOST, port: int = MACHINE_PORT, dbname: str = "postgres") -> str:
    """Run one SQL command as the superuser through ``psql``; returns its unaligned output."""
    env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}
    env.pop("PGPASSWORD", None)
    proc = subprocess.run(
        [
            shutil.which("psql") or pg_bin("psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            host,
            "-p",
            str(port),
            "-U",
            SUPERUSER,
            "-d",
            dbname,
            "-c",
            sql,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise ServerError(f"psql on {host}:{port} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: "
    f"apt-get install postgresql (Debian), or set {BIN_ENV} to their directory"
)


def missing() -> str | None:
    """What to install so a throwaway cluster can start here (None: nothing)."""
    try:
        pg_bin("initdb")
        pg_bin("pg_ctl")
    except ServerError:
        return INSTALL_HINT
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return f"running as root, initdb needs a {SUPERUSER!r} user to run as (useradd {SUPERUSER})"
    return None


def available() -> bool:
    """True when a throwaway cluster can be started here."""
    return missing() is None


def machine_server_available(host: str = HOST, port: int = MACHINE_PORT) -> bool:
    """True when the machine's PostgreSQL answers as ``postgres`` without a password."""
    try:
        return psql("SELECT 1", host=host, port=port) == "1"
    except (ServerError, OSError, subprocess.TimeoutExpired):
        return False


def url_for(dbname: str, *, host: str = HOST, port: int = MACHINE_PORT) -> str:
    """The store URL of ``dbname`` on ``host:port`` as the superuser."""
    return f"postgresql://{SUPERUSER}@{host}:{port}/{dbname}"


# -- a fresh database on the machine's server -----------------------------------------------


def create_database(host: str = HOST, port: int = MACHINE_PORT) -> str:
    """Create a uniquely named UTF8 database; returns its name."""
    name = f"agent_stores_test_{os.getpid()}_{secrets.token_hex(4)}"
    psql(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'", host=host, port=port)
    return name


def drop_database(name: str, host: str = HOST, port: int = MACHINE_PORT) -> None:
    """Drop ``name``, disconnecting whoever is still connected to it."""
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", host=host, port=port)


@contextlib.contextmanager
def fresh_database(host: str = HOST, port: int = MACHINE_PORT) -> Iterator[str]:
    """A new database on an existing server for the duration of the block; yields its URL."""
    name = create_database(host, port)
    try:
        yield url_for(name, host=host, port=port)
    finally:
        drop_database(name, host, port)


# -- a throwaway cluster --------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _as_owner(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: hand them to the postgres user.
    if os.geteuid() == 0:
        return ["runuser", "-u", SUPERUSER, "--", *argv]
    return argv


# -- PostgreSQL with pgvector ---------------------------------------------------------------

#: pgserver's wheel carries PostgreSQL 16 binaries with pgvector 0.6.2: the one registry
#: package that gives this machine (Debian's PostgreSQL 15 has no pgvector) a server with
#: the extension, offline once installed. Only its binaries are used.
PGSERVER = "pgserver==0.1.4"
PGVECTOR_BIN_ENV = "AGENT_STORES_PGVECTOR_BIN"
#: Set (``.ci/run`` does) to fail instead of running without the pgvector cluster.
REQUIRE_PGVECTOR_ENV = "AGENT_STORES_REQUIRE_PGVECTOR"
# Outside the checkout: the postgres user must read the binaries, and a fresh clone lives
# in a directory only root may enter.
PGSERVER_HOME = Path(tempfile.gettempdir()) / "agent-stores-pgserver-0.1.4"


def pgvector_bin() -> str:
    """The bin directory of a PostgreSQL with pgvector: ``$AGENT_STORES_PGVECTOR_BIN``, else
    pgserver's, installed on first use (pip, else uv) into a shared folder."""
    configured = os.environ.get(PGVECTOR_BIN_ENV)
    if configured:
        return configured
    bin_dir = PGSERVER_HOME / "pgserver" / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        PGSERVER_HOME.mkdir(parents=True, exist_ok=True)
        PGSERVER_HOME.chmod(0o755)
        target = ["--no-deps", "--target", str(PGSERVER_HOME), PGSERVER]
        attempts = [[sys.executable, "-m", "pip", "install", "--quiet", *target]]
        if shutil.which("uv"):
            attempts.append(
                ["uv", "pip", "install", "--quiet", "--python", sys.executable, *target]
            )
        errors = []
        for argv in attempts:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
            if proc.returncode == 0 and (bin_dir / "postgres").is_file():
                break
            errors.append(f"{' '.join(argv[:4])}: {proc.stderr.strip()[-300:]}")
        else:
            raise ServerError(f"could not install {PGSERVER}: " + "; ".join(errors))
    return str(bin_dir)


@dataclass
class Cluster:
    """A private PostgreSQL cluster in ``directory`` listening on ``port`` (binaries from
    ``bin_dir``, else :func:`pg_bin`'s)."""

    directory: Path
    port: int
    bin_dir: str | None = None

    def bin(self, name: str) -> str:
        """Path of the server binary ``name`` this cluster runs."""
        return str(Path(self.bin_dir) / name) if self.bin_dir else pg_bin(name)

    @property
    def datadir(self) -> Path:
        """The cluster's data directory."""
        return self.directory / "data"

    @property
    def logfile(self) -> Path:
        """The server log."""
        return self.directory / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        """The store URL of ``dbname`` in this cluster."""
        return url_for(dbname, port=self.port)

    def _run(self, argv: list[str], timeout: float = START_TIMEOUT) -> None:
        proc = subprocess.run(
            _as_owner(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
        if proc.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
            raise ServerError(
                f"{Path(argv[0]).name} failed ({proc.returncode}): {proc.stderr.strip()}\n{log}"
            )

    def init(self) -> None:
        """Create the data directory (trust auth, UTF8, no fsync)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SUPERUSER)
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
        self._run(
            [
                self.bin("initdb"),
                "-D",
                str(self.datadir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = " ".join(
            [
                f"-c port={self.port}",
                f"-c listen_addresses={HOST}",
                f"-c unix_socket_directories={self.directory}",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            [
                self.bin("pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                options,
                "-w",
                "-t",
                str(START_TIMEOUT),
                "start",
            ]
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not machine_server_available(port=self.port):
            if time.monotonic() > deadline:
                raise ServerError(f"cluster on port {self.port} did not answer")
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients, clean shutdown)."""
        self._run([self.bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        """Stop and start again on the same port and data (clients are disconnected)."""
        self.stop()
        self.start()

    def running(self) -> bool:
        """True while the postmaster runs."""
        proc = subprocess.run(
            _as_owner([self.bin("pg_ctl"), "-D", str(self.datadir), "status"]),
            capture_output=True,
            check=False,
        )
        return proc.returncode == 0

    def remove(self) -> None:
        """Stop the server if it runs and delete everything."""
        if self.datadir.exists() and self.running():
            with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)


def start_cluster(directory: Path | None = None, bin_dir: str | None = None) -> Cluster:
    """Initialise and start a throwaway cluster on a free port."""
    base = Path(tempfile.mkdtemp(prefix="agent-stores-pg-")) if directory is None else directory
    last: Exception | None = None
    for _ in range(3):  # a free port may be taken between probing and binding
        cluster = Cluster(base, free_port(), bin_dir)
        try:
            if not cluster.datadir.exists():
                cluster.init()
            cluster.start()
            return cluster
        except ServerError as exc:
            last = exc
            if "could not bind" not in str(exc) and "already in use" not in str(exc):
                break
    shutil.rmtree(base, ignore_errors=True)
    raise ServerError(f"could not start a throwaway PostgreSQL cluster: {last}")


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """A private cluster for the duration of the block (safe to restart or stop)."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.remove()


# -- the server tests use -------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(*, throwaway: bool = True) -> Iterator[dict[str, str]]:
    """``{"postgres": url}`` of a fresh, empty database, removed afterwards.

    A private throwaway cluster; ``throwaway=False`` uses a new database on the machine's
    server instead (only when a caller asks for it).
    """
    with contextlib.ExitStack() as stack:
        if not throwaway:
            urls = {"postgres": stack.enter_context(fresh_database())}
        else:
            urls = {"postgres": stack.enter_context(throwaway_cluster()).url()}
        pgvector = stack.enter_context(pgvector_cluster())
        if pgvector is not None:
            urls["pgvector"] = pgvector.url()
        yield urls


@contextlib.contextmanager
def pgvector_cluster() -> Iterator[Cluster | None]:
    """A throwaway cluster of a PostgreSQL with pgvector (:func:`pgvector_bin`); None, with
    a warning, when none can be had here (an error if ``$AGENT_STORES_REQUIRE_PGVECTOR``)."""
    try:
        cluster = start_cluster(bin_dir=pgvector_bin())
    except (ServerError, OSError, subprocess.SubprocessError) as exc:
        if os.environ.get(REQUIRE_PGVECTOR_ENV):
            raise
        print(
            f"warning: no PostgreSQL with pgvector here ({exc}); its target is left out",
            file=sys.stderr,
        )
        yield None
        return
    try:
        yield cluster
    finally:
        cluster.remove()


def env_for(urls: dict[str, str]) -> dict[str, str]:
    """The environment variables the test suites read."""
    found = {URL_ENV: urls["postgres"]}
    if "pgvector" in urls:
        found[PGVECTOR_URL_ENV] = urls["pgvector"]
    return found


# -- command line ---------------------------------------------------------------------------


def _state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def _load_state(state_dir: Path) -> dict[str, object] | None:
    path = _state_file(state_dir)
    if not path.exists():
        return None
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


def _cli_start(state_dir: Path, machine: bool, pgvector: bool = False) -> int:
    state = _load_state(state_dir)
    if state is not None:
        print(f"{URL_ENV}={state['url']}")
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    if machine:
        name = create_database()
        state = {"kind": "database", "database": name, "url": url_for(name)}
    else:
        cluster = start_cluster(bin_dir=pgvector_bin() if pgvector else None)
        state = {
            "kind": "cluster",
            "directory": str(cluster.directory),
            "port": cluster.port,
            "url": cluster.url(),
            "bin_dir": cluster.bin_dir,
        }
    _state_file(state_dir).write_text(json.dumps(state))
    print(f"{URL_ENV}={state['url']}")
    return 0


def _cli_stop(state_dir: Path) -> int:
    state = _load_state(state_dir)
    if state is None:
        print("no PostgreSQL test server recorded", file=sys.stderr)
        return 0
    if state["kind"] == "database":
        drop_database(str(state["database"]))
    else:
        port, bin_dir = state["port"], state.get("bin_dir")
        Cluster(
            Path(str(state["directory"])),
            int(port) if isinstance(port, int) else 0,
            str(bin_dir) if bin_dir else None,
        ).remove()
    _state_file(state_dir).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start [--throwaway]`` | ``url`` | ``stop``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["start", "stop", "url"])
    parser.add_argument(
        "--machine",
        action="store_true",
        help="a fresh database on the machine's server instead of a private cluster",
    )
    parser.add_argument(
        "--pgvector",
        action="store_true",
        help=f"a private cluster of PostgreSQL 16 with pgvector ({PGSERVER}'s binaries)",
    )
    parser.add_argument("--throwaway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return _cli_start(args.state_dir, args.machine, args.pgvector)
        if args.command == "stop":
            return _cli_stop(args.state_dir)
        state = _load_state(args.state_dir)
        if state is None:
            print("no PostgreSQL test server recorded; run 'start' first", file=sys.stderr)
            return 1
        print(f"{URL_ENV}={state['url']}")
        return 0
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

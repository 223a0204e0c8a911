"""Private Redis servers for tests: one standalone server and a 3-master Redis Cluster.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. Every server binds to 127.0.0.1 on a free port, keeps nothing on disk
(``--save '' --appendonly no``) and lives in its own directory; the machine's own Redis
on 6379 is never touched.

As a library (load it by path: the file is named ``redis.py`` and must not shadow
redis-py, so do not put its folder on ``sys.path``)::

    with redis_servers() as urls:
        urls["redis"]          # redis://127.0.0.1:P/0?prefix=agent-stores-test-…
        urls["redis-cluster"]  # redis+cluster://127.0.0.1:Q?prefix=agent-stores-test-…

As a command (state kept in ``.servers/redis/`` at the repository root)::

    python scripts/servers/redis.py start   # prints the export lines below
    python scripts/servers/redis.py urls    # AGENT_STORES_TEST_REDIS_URL=… / …_CLUSTER_URL=…
    python scripts/servers/redis.py stop

Each URL carries a unique ``prefix`` so concurrent test runs never clobber each other.
"""

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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

STANDALONE_ENV = "AGENT_STORES_TEST_REDIS_URL"
CLUSTER_ENV = "AGENT_STORES_TEST_REDIS_CLUSTER_URL"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".servers" / "redis"
HOST = "127.0.0.1"
START_TIMEOUT = 20.0


class ServerError(RuntimeError):
    """A server could not be started or stopped."""


# -- a tiny RESP client (stdlib only) ---------------------------------------------------


def _encode(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(f"${len(raw)}\r\n".encode() + raw + b"\r\n")
    return b"".join(out)


def _read_reply(reader: BinaryIO) -> object:
    line = reader.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise ServerError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = reader.read(size + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        return [_read_reply(reader) for _ in range(int(rest))]
    raise ServerError(f"unexpected reply {line!r}")


def command(port: int, *args: str, timeout: float = 2.0, password: str | None = None) -> object:
    """Send one command to ``127.0.0.1:port`` (after ``AUTH`` if a password is given)."""
    with (
        socket.create_connection((HOST, port), timeout=timeout) as sock,
        sock.makefile("rb") as reader,
    ):
        if password is not None:
            sock.sendall(_encode("AUTH", password))
            _read_reply(reader)
        sock.sendall(_encode(*args))
        return _read_reply(reader)


def _ping(port: int, password: str | None = None) -> bool:
    try:
        return command(port, "PING", timeout=0.5, password=password) == "PONG"
    except (OSError, ServerError):
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, cluster: bool = False, avoid: set[int] | None = None) -> int:
    """A free loopback port (for a cluster node, its bus port ``port + 10000`` is free too)."""
    avoid = avoid or set()
    for _ in range(500):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if cluster and port + 10000 > 65535:
            continue
        if port in avoid or port == 6379 or (cluster and not _port_free(port + 10000)):
            continue
        return port
    raise ServerError("no free loopback port found")


# -- one server ---------------------------------------------------------------------------


@dataclass
class RedisServer:
    """One private ``redis-server`` on ``127.0.0.1:port`` with its own directory."""

    port: int
    directory: Path
    cluster: bool = False
    extra_args: list[str] = field(default_factory=list)
    password: str | None = None

    @property
    def pidfile(self) -> Path:
        return self.directory / "redis.pid"

    @property
    def logfile(self) -> Path:
        return self.directory / "redis.log"

    def argv(self) -> list[str]:
        """The ``redis-server`` command line."""
        args = [
            _binary("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--dir",
            str(self.directory),
            "--pidfile",
            str(self.pidfile),
            "--logfile",
            str(self.logfile),
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.directory / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
            ]
        if self.password is not None:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self) -> None:
        """Start the daemon (again, on the same port and directory) and wait until it answers."""
        if self.port == 6379:
            raise ServerError("refusing to run a private server on 6379 (the machine's Redis)")
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        result = subprocess.run(self.argv(), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServerError(
                f"redis-server on port {self.port} failed: {result.stderr or result.stdout}"
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port, self.password):
            if time.monotonic() > deadline:
                # Never leave a daemon behind that nobody will stop.
                with contextlib.suppress(ServerError):
                    self.kill()
                raise ServerError(
                    f"redis-server on port {self.port} did not answer; see {self.logfile}"
                )
            time.sleep(0.05)

    def pid(self) -> int | None:
        """The daemon's pid from its pidfile (None when not running)."""
        try:
            return int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def kill(self) -> None:
        """Crash the server (SIGKILL) and wait until its port is closed: a real failure."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._wait_gone(pid)

    def stop(self) -> None:
        """Shut the server down (``SHUTDOWN NOSAVE``, SIGKILL if it does not go)."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(OSError, ServerError):
            command(self.port, "SHUTDOWN", "NOSAVE", timeout=2.0, password=self.password)
        try:
            self._wait_gone(pid, timeout=5.0)
        except ServerError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid)

    def _wait_gone(self, pid: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while _alive(pid) or _ping(self.port, self.password):
            if time.monotonic() > deadline:
                raise ServerError(f"redis-server pid {pid} on port {self.port} did not stop")
            time.sleep(0.02)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); check /proc where it exists.
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        with contextlib.suppress(OSError):
            return "\nState:\tZ" not in status.read_text()
    return True


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ServerError(f"{name} is not installed (Debian: apt-get install redis-server)")
    return path


# -- a cluster ----------------------------------------------------------------------------


@dataclass
class RedisClusterServers:
    """Three masters on loopback ports, joined with ``redis-cli --cluster create``."""

    nodes: list[RedisServer]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        result = subprocess.run(
            [
                _binary("redis-cli"),
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed: {result.stdout}{result.stderr}")
        self.wait_ok()

    def wait_ok(self) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows all the others."""
        deadline = time.monotonic() + START_TIMEOUT
        for node in self.nodes:
            while True:
                info = _info_dict(str(command(node.port, "CLUSTER", "INFO")))
                if info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(
                    len(self.nodes)
                ):
                    break
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"cluster never reached cluster_state:ok (node {node.port}: {info})"
                    )
                time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _info_dict(text: str) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


# -- the context manager ------------------------------------------------------------------


@dataclass
class RedisTestServers:
    """What :func:`redis_servers` started: the standalone server, the cluster and their URLs."""

    standalone: RedisServer
    cluster: RedisClusterServers
    urls: dict[str, str]
    directory: Path

    def stop(self) -> None:
        errors: list[BaseException] = []
        for stopper in (self.standalone.stop, self.cluster.stop):
            try:
                stopper()
            except BaseException as exc:  # keep stopping the others
                errors.append(exc)
        shutil.rmtree(self.directory, ignore_errors=True)
        if errors:
            raise errors[0]

    def state(self) -> dict[str, object]:
        return {
            "directory": str(self.directory),
            "standalone": self.standalone.port,
            "cluster": [node.port for node in self.cluster.nodes],
            "urls": self.urls,
        }


def _unique_prefix() -> str:
    return f"agent-stores-test-{uuid.uuid4().hex[:10]}"


def start_servers(directory: Path | None = None, *, cluster: bool = True) -> RedisTestServers:
    """Start the standalone server and (unless ``cluster=False``) the 3-master cluster."""
    directory = directory or Path(tempfile.mkdtemp(prefix="agent-stores-redis-"))
    directory.mkdir(parents=True, exist_ok=True)
    used: set[int] = set()
    port = free_port(avoid=used)
    used.add(port)
    standalone = RedisServer(port, directory / f"standalone-{port}")
    nodes: list[RedisServer] = []
    if cluster:
        for _ in range(3):
            node_port = free_port(cluster=True, avoid=used | {p + 10000 for p in used})
            used |= {node_port, node_port + 10000}
            nodes.append(RedisServer(node_port, directory / f"cluster-{node_port}", cluster=True))
    servers = RedisTestServers(standalone, RedisClusterServers(nodes), {}, directory)
    try:
        standalone.start()
        urls = {"redis": f"redis://{HOST}:{port}/0?prefix={_unique_prefix()}"}
        if cluster:
            servers.cluster.start()
            urls["redis-cluster"] = (
                f"redis+cluster://{HOST}:{nodes[0].port}?prefix={_unique_prefix()}"
            )
        servers.urls = urls
    except BaseException:
        with contextlib.suppress(Exception):
            servers.stop()
        raise
    return servers


@contextlib.contextmanager
def redis_servers(*, cluster: bool = True) -> Iterator[dict[str, str]]:
    """Start private servers, yield ``{"redis": url, "redis-cluster": url}``, stop them on exit."""
    servers = start_servers(cluster=cluster)
    try:
        yield dict(servers.urls)
    finally:
        servers.stop()


def env_for(urls: dict[str, str]) -> dict[str, str]:
    """The environment variables the Redis tests read, for ``urls`` from :func:`redis_servers`."""
    env = {STANDALONE_ENV: urls["redis"]}
    if "redis-cluster" in urls:
        env[CLUSTER_ENV] = urls["redis-cluster"]
    return env


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


def _cli_start(state_dir: Path, cluster: bool, as_json: bool) -> int:
    state = _load_state(state_dir)
    if state is not None:
        urls = state["urls"]
        assert isinstance(urls, dict)
        if _ping(int(str(state["standalone"]))):
            print("already running", file=sys.stderr)
            _print_urls(urls, as_json)
            return 0
        _cli_stop(state_dir)
    servers = start_servers(state_dir / "data", cluster=cluster)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(json.dumps(servers.state(), indent=2))
    _print_urls(servers.urls, as_json)
    return 0


def _cli_stop(state_dir: Path) -> int:
    state = _load_state(state_dir)
    if state is None:
        print("no servers recorded", file=sys.stderr)
        return 0
    directory = Path(str(state["directory"]))
    standalone_port = int(str(state["standalone"]))
    cluster_ports = state["cluster"]
    assert isinstance(cluster_ports, list)
    servers = RedisTestServers(
        RedisServer(standalone_port, directory / f"standalone-{standalone_port}"),
        RedisClusterServers(
            [RedisServer(int(p), directory / f"cluster-{p}", cluster=True) for p in cluster_ports]
        ),
        {},
        directory,
    )
    servers.stop()
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` | ``stop`` | ``urls`` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="scripts/servers/redis.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "urls"])
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help="where state is kept")
    parser.add_argument(
        "--no-cluster", action="store_true", help="start the standalone server only"
    )
    parser.add_argument("--json", action="store_true", help="print the URLs as JSON")
    args = parser.parse_args(argv)
    if args.action == "start":
        return _cli_start(args.state_dir, not args.no_cluster, args.json)
    if args.action == "stop":
        return _cli_stop(args.state_dir)
    state = _load_state(args.state_dir)
    if state is None:
        print("not running; use: python scripts/servers/redis.py start", file=sys.stderr)
        return 1
    urls = state["urls"]
    assert isinstance(urls, dict)
    _print_urls(urls, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

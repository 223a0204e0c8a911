"""A private Google Cloud Firestore emulator for tests.

Standard library only, so nox, ``.ci/run`` and a bare ``python`` can use it before any
virtualenv exists. The emulator is Google's own (``gcloud emulators firestore start``,
a Java program), bound to 127.0.0.1 on a free port, holding its data in memory only. It
runs in a process group of its own, and stopping it stops the whole group (gcloud's
launcher and the Java process). It is slow to boot, so a test run starts it once and
clears its data between runs through the emulator's REST endpoint instead of
restarting it::

    DELETE http://HOST:PORT/emulator/v1/projects/PROJECT/databases/(default)/documents

As a library (load it by path)::

    with firestore_server() as urls:
        urls["firestore"]   # firestore://agent-stores-test/agent-stores?emulator_host=…&prefix=…

As a command (state kept in ``.servers/firestore/`` at the repository root)::

    python scripts/servers/firestore.py start   # prints AGENT_STORES_TEST_FIRESTORE_URL=…
    python scripts/servers/firestore.py urls
    python scripts/servers/firestore.py reset   # clear the data of a running emulator
    python scripts/servers/firestore.py stop

``start`` on a running emulator reuses it, handing out a URL with a new ``prefix``; it
never clears data (another run may be using the emulator: only ``reset`` clears). Each URL
carries a unique ``prefix``, so concurrent test runs on one emulator never see each
other's data. ``--json`` prints ``{"firestore": URL}`` instead of the variable.

Two runs on one machine never share an emulator by accident: each picks a free port, and
an emulator counts as started only once *its own* log says it serves (so another run's
emulator answering on the same port never passes for ours); when the port was taken
between picking and binding, the emulator exits and is started again on another port.
Its working folder (the log) is private to the run (a fresh temporary folder, or the
state folder given with ``--state-dir``).
"""

import argparse
import contextlib
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

URL_ENV = "AGENT_STORES_TEST_FIRESTORE_URL"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".servers" / "firestore"
HOST = "127.0.0.1"
PROJECT = "agent-stores-test"
COLLECTION = "agent-stores"
#: How the memory watch names the emulator.
WATCHED_NAME = "the Firestore emulator"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0
MIN_JAVA = 11
#: Ports tried when the one picked is taken before the emulator binds it.
START_ATTEMPTS = 3
#: What the emulator logs once it serves, and what it logs when its port is taken.
READY_LINE = "Dev App Server is now running"
PORT_TAKEN = ("BindException", "Address already in use")

INSTALL_HINT = (
    "the Firestore emulator needs the Google Cloud CLI with its emulator component and a "
    "Java runtime (11 or newer, 17 or 21 recommended). On Debian/Ubuntu, with Google's apt "
    "repository: apt-get install google-cloud-cli google-cloud-cli-firestore-emulator "
    "openjdk-17-jre-headless; with a standalone SDK: gcloud components install "
    "cloud-firestore-emulator"
)


class ServerError(RuntimeError):
    """The emulator could not be started, reset or stopped."""


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


class PortTakenError(ServerError):
    """The emulator's port was taken by another process before the emulator bound it."""


# -- what is installed ------------------------------------------------------------------


def _sdk_root() -> Path | None:
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    # /usr/bin/gcloud -> <sdk>/bin/gcloud
    return Path(gcloud).resolve().parent.parent


def _emulator_installed() -> bool:
    root = _sdk_root()
    return root is not None and (root / "platform" / "cloud-firestore-emulator").is_dir()


def _java_major() -> int | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older print "1.8.0_…".
    return int(match.group(2) or 0) if major == 1 else major


def missing() -> list[str]:
    """What is missing to run the emulator here (empty when it can run)."""
    problems = []
    if shutil.which("gcloud") is None:
        problems.append("gcloud (package google-cloud-cli)")
    elif not _emulator_installed():
        problems.append("the Firestore emulator (package google-cloud-cli-firestore-emulator)")
    java = _java_major()
    if java is None:
        problems.append("a Java runtime (package openjdk-17-jre-headless)")
    elif java < MIN_JAVA:
        problems.append(f"Java {MIN_JAVA}+ (found Java {java}; package openjdk-17-jre-headless)")
    return problems


def available() -> bool:
    """Can the emulator run here (gcloud, its Firestore emulator component and Java)?"""
    return not missing()


def _require() -> str:
    problems = missing()
    if problems:
        raise ServerError(f"cannot start the Firestore emulator: missing {', '.join(problems)}; "
                          f"{INSTALL_HINT}")  # fmt: skip
    gcloud = shutil.which("gcloud")
    assert gcloud is not None
    return gcloud


# -- talking to it ------------------------------------------------------------------------


def free_port() -> int:
    """A free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _http(method: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")


def answers(port: int) -> bool:
    """True when an emulator answers on ``port`` (its root page says ``Ok``)."""
    try:
        status, body = _http("GET", port, "/", timeout=1.0)
    except (OSError, urllib.error.URLError):
        return False
    return status == 200 and body.strip() == "Ok"


def reset(port: int, project: str = PROJECT, database: str = "(default)") -> None:
    """Delete every document of ``project`` in the emulator on ``port`` (no restart)."""
    quoted = urllib.parse.quote(database, safe="")
    path = f"/emulator/v1/projects/{project}/databases/{quoted}/documents"
    try:
        status, body = _http("DELETE", port, path, timeout=30.0)
    except (OSError, urllib.error.URLError) as exc:
        raise ServerError(f"cannot reset the Firestore emulator on port {port}: {exc}") from None
    if status != 200:
        raise ServerError(f"resetting the Firestore emulator failed ({status}): {body[:200]}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(
    pgid: int, port: int | None, process: "subprocess.Popen[bytes] | None" = None
) -> None:
    """SIGTERM the emulator's whole process group, SIGKILL it if it does not go, and wait
    until the group is gone and (given the ``port`` it served on) the port is quiet."""
    for sig, timeout in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None:
                process.poll()  # reap the launcher so the group can empty
            if not _group_alive(pgid) and (port is None or not answers(port)):
                return
            time.sleep(0.1)
    raise ServerError(f"the Firestore emulator (process group {pgid}) did not stop")


# -- one emulator -------------------------------------------------------------------------


@dataclass
class FirestoreEmulator:
    """One ``gcloud emulators firestore start`` on ``127.0.0.1:port`` in its own process group."""

    port: int
    directory: Path
    process: "subprocess.Popen[bytes] | None" = None
    pgid: int | None = None
    #: set once it served: until then the port may be another program's
    served: bool = False

    @property
    def logfile(self) -> Path:
        return self.directory / "emulator.log"

    @property
    def host(self) -> str:
        return f"{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [
            _require(),
            "emulators",
            "firestore",
            "start",
            f"--host-port={self.host}",
            "--quiet",
        ]

    def start(self) -> None:
        """Start the emulator and wait until it answers; never leaves a half-started one."""
        argv = self.argv()
        self.directory.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1")
        with self.logfile.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=env,
                start_new_session=True,  # its own process group, stopped as one
            )
        self.pgid = self.process.pid
        try:
            deadline = time.monotonic() + START_TIMEOUT
            # Its own log line first: an emulator of another run may answer on this port.
            while not (self._logged(READY_LINE) and answers(self.port)):
                if self.process.poll() is not None:
                    if any(self._logged(text) for text in PORT_TAKEN):
                        raise PortTakenError(f"port {self.port} was taken by another process")
                    raise ServerError(
                        f"the Firestore emulator exited with {self.process.returncode}:\n"
                        f"{self.log_tail()}\n{INSTALL_HINT}"
                    )
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"the Firestore emulator did not answer on {self.host} within "
                        f"{START_TIMEOUT:.0f}s:\n{self.log_tail()}"
                    )
                time.sleep(0.2)
            self.served = True
        except BaseException:
            with contextlib.suppress(ServerError):
                self.stop()
            raise

    def _logged(self, text: str) -> bool:
        try:
            return text in self.logfile.read_text(errors="replace")
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the emulator's whole process group."""
        if self.pgid is None:
            return
        _stop_group(self.pgid, self.port if self.served else None, self.process)
        self.pgid = None


def _unique_prefix() -> str:
    return f"agent-stores-test-{uuid.uuid4().hex[:10]}"


def url_for(port: int, prefix: str | None = None) -> str:
    """The store URL of the emulator on ``port`` with a unique ``prefix``."""
    return (
        f"firestore://{PROJECT}/{COLLECTION}?emulator_host={HOST}:{port}"
        f"&prefix={prefix or _unique_prefix()}"
    )


def start_emulator(directory: Path | None = None) -> FirestoreEmulator:
    """Start an emulator on a free port (the caller stops it)."""
    directory = directory or Path(tempfile.mkdtemp(prefix="agent-stores-firestore-"))
    for attempt in range(START_ATTEMPTS):
        emulator = FirestoreEmulator(free_port(), directory)
        try:
            emulator.start()
        except PortTakenError:
            # Another process bound the free port we picked first: pick again.
            if attempt + 1 == START_ATTEMPTS:
                raise
            continue
        return emulator
    raise AssertionError("unreachable")


@contextlib.contextmanager
def firestore_server() -> Iterator[dict[str, str]]:
    """Start a private emulator, yield ``{"firestore": url}``, stop it (its whole group) on exit.

    Its resident memory (gcloud's launcher and the JVM) is watched meanwhile (``watch.py``:
    6 GB by default, ``AGENT_STORES_FIRESTORE_SERVER_RSS_LIMIT_MB``); above it the emulator
    is killed and the run stops with :class:`ServerMemoryError`.
    """
    directory = Path(tempfile.mkdtemp(prefix="agent-stores-firestore-"))
    try:
        emulator = start_emulator(directory)
        try:
            assert emulator.pgid is not None
            # Its resident memory watched (gcloud and the JVM): above the bound the run
            # stops (watch.py).
            with _watch().watching(WATCHED_NAME, emulator.pgid, "firestore"):
                yield {"firestore": url_for(emulator.port)}
        finally:
            emulator.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def env_for(urls: dict[str, str]) -> dict[str, str]:
    """The environment variable the Firestore tests read, for ``urls`` from :func:`firestore_server`."""
    return {URL_ENV: urls["firestore"]}


# -- command line -------------------------------------------------------------------------


def _load_state(state_dir: Path) -> dict[str, object] | None:
    path = state_dir / "state.json"
    if not path.exists():
        return None
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _print_url(url: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"firestore": url}))
    else:
        print(f"{URL_ENV}={url}")


def _cli_start(state_dir: Path, as_json: bool = False) -> int:
    state = _load_state(state_dir)
    if state is not None:
        port = int(str(state["port"]))
        if answers(port):
            # Reused as it is: another run may be working on it (``reset`` clears it).
            print("already running: a URL with a new prefix", file=sys.stderr)
            _print_url(url_for(port), as_json)
            return 0
        _cli_stop(state_dir)
    emulator = start_emulator(state_dir / "data")
    url = url_for(emulator.port)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(
        json.dumps({"port": emulator.port, "pgid": emulator.pgid, "url": url}, indent=2)
    )
    _print_url(url, as_json)
    return 0


def _cli_stop(state_dir: Path) -> int:
    state = _load_state(state_dir)
    if state is None:
        print("no emulator recorded", file=sys.stderr)
        return 0
    _stop_group(int(str(state["pgid"])), int(str(state["port"])))
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` | ``stop`` | ``urls`` | ``reset`` | ``check`` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="scripts/servers/firestore.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "urls", "reset", "check"])
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help="where state is kept")
    parser.add_argument("--json", action="store_true", help="print the URL as JSON")
    args = parser.parse_args(argv)
    if args.action == "check":
        problems = missing()
        if problems:
            print(f"missing: {', '.join(problems)}\n{INSTALL_HINT}", file=sys.stderr)
            return 1
        print("the Firestore emulator can run here")
        return 0
    try:
        if args.action == "start":
            return _cli_start(args.state_dir, args.json)
        if args.action == "stop":
            return _cli_stop(args.state_dir)
        state = _load_state(args.state_dir)
        if state is None:
            print("not running; use: python scripts/servers/firestore.py start", file=sys.stderr)
            return 1
        if args.action == "reset":
            reset(int(str(state["port"])))
            return 0
        _print_url(str(state["url"]), args.json)
        return 0
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

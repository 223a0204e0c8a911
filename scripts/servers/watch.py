"""The resident memory of a test server the project started, watched from the run that started it.

Standard library only (Linux ``/proc``), like the server scripts that use it. A
:class:`ServerWatch` polls, on a background thread, the resident memory (RSS) of a server's
process and of every process in its tree (its children, theirs, and so on: gcloud's
launcher and the Firestore emulator's JVM), and records the peak.
Above the server's bound it stops the server at once (``SIGKILL`` of its process group: the
point is to give the machine its memory back), prints why on stderr, and interrupts the main
thread of the run that started it (``SIGINT``: nox stops the command it is running, pytest
stops the session); when the server's ``with`` block is left, :class:`ServerMemoryError`
ends the run with the same message (a ``SystemExit``: no ``except Exception`` swallows it).

Why: ``nox -s bench`` once drove moto to 22 GB resident while a contract run shared the
machine, which swapped until the server was killed by hand (issue 59). moto deep-copies the
whole table on every ``TransactWriteItems``.

The bound, in MB: ``AGENT_STORES_<NAME>_SERVER_RSS_LIMIT_MB`` (``<NAME>`` the server's
backend: ``DYNAMODB``, ``COSMOS``, ``FIRESTORE``), else ``AGENT_STORES_SERVER_RSS_LIMIT_MB``
(every watched server), else the server's default (:data:`DEFAULT_LIMITS_MB`); ``0`` turns
the watch off. Servers started with a script's ``start`` command outlive the command and
are not watched.

Every watch started in a process is kept in :data:`WATCHES`; :func:`peaks_line` says their
peaks (``nox -s bench`` prints it and writes it into docs/benchmarks.md's header).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

LIMIT_ENV = "AGENT_STORES_SERVER_RSS_LIMIT_MB"
#: Bounds (MB) of the servers the project starts, far above what they take in the tests and
#: the bench (moto some 130 MB in the bench's DynamoDB rows, the Firestore emulator's JVM
#: some 300 MB in a contract run), far below a 24 GB machine. moto's is the one that was
#: passed: 4 GB, a sixth of that machine. cosmosdb-server (Node) gets the same; the
#: Firestore emulator's JVM may grow its heap to a quarter of the machine's memory before it
#: must collect, so its bound leaves it that room on a 24 GB machine.
DEFAULT_LIMITS_MB = {"dynamodb": 4096, "cosmos": 4096, "firestore": 6144}
POLL_SECONDS = 0.5
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MB = 1024 * 1024


def limit_env(backend: str) -> str:
    """The variable holding one server's bound: ``AGENT_STORES_DYNAMODB_SERVER_RSS_LIMIT_MB``."""
    return f"AGENT_STORES_{backend.upper()}_SERVER_RSS_LIMIT_MB"


def limit_mb(backend: str, default: int | None = None) -> int:
    """The bound of ``backend``'s server in MB (0: not watched); see the module docstring."""
    for variable in (limit_env(backend), LIMIT_ENV):
        value = os.environ.get(variable, "").strip()
        if value:
            try:
                return max(0, int(float(value)))
            except ValueError:
                raise ValueError(f"{variable}={value!r}: expected a number of MB") from None
    return DEFAULT_LIMITS_MB.get(backend, 4096) if default is None else default


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, session id)`` of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[3])


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children``; None where the kernel
    has no such files."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found  # gone
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except FileNotFoundError:
            if not Path(f"/proc/{pid}/task/{task}").exists():
                continue  # the thread ended in between
            return None
        except OSError:
            continue
    return found


def _scan(root: int) -> set[int]:
    """:func:`tree` by reading every process's parent and session (slower)."""
    parents: dict[int, int] = {}
    found = {root}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None:
            continue
        parents[int(entry.name)] = stat[0]
        if stat[1] == root:
            found.add(int(entry.name))
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def tree(root: int) -> set[int]:
    """``root`` and its descendants (every process of the session ``root`` leads too, on a
    kernel without ``/proc/PID/task/TID/children``)."""
    found, todo = {root}, [root]
    while todo:
        children = _children(todo.pop())
        if children is None:
            return _scan(root)
        todo += [c for c in children if c not in found]
        found.update(children)
    return found


def rss_bytes(root: int) -> int:
    """Resident memory of ``root``'s tree (see :func:`tree`) in bytes; 0 once it is gone."""
    total = 0
    for pid in tree(root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue  # gone in between
    return total


def kill_group(pid: int) -> None:
    """``SIGKILL`` the process group ``pid`` leads (and ``pid`` itself)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def interrupt_main_thread() -> None:
    """Deliver ``SIGINT`` to this process's main thread (it wakes from a blocking wait)."""
    main = threading.main_thread()
    # From the main thread itself nothing to interrupt: the caller's check() raises.
    if main.ident is not None and main.is_alive() and main is not threading.current_thread():
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(main.ident, signal.SIGINT)


class ServerMemoryError(SystemExit):
    """A watched server went above its resident memory bound; the run is stopped."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ServerWatch:
    """Polls the resident memory of one server's process tree; see the module docstring.

    ``on_exceed(watch)`` runs once, on the watch's thread, when the bound is passed; the
    default stops the server (``stop``, else ``SIGKILL`` of its process group) and
    interrupts the main thread.
    """

    def __init__(
        self,
        name: str,
        pid: int,
        backend: str,
        *,
        limit: int | None = None,
        interval: float = POLL_SECONDS,
        stop: Callable[[], None] | None = None,
        on_exceed: Callable[[ServerWatch], None] | None = None,
    ) -> None:
        self.name, self.pid, self.backend = name, pid, backend
        self.limit_mb = limit_mb(backend) if limit is None else limit
        self.interval = interval
        self._stop_server = stop or (lambda: kill_group(pid))
        self._on_exceed = on_exceed or ServerWatch.stop_run
        self.peak_bytes = 0
        self.exceeded: str | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / _MB

    def start(self) -> ServerWatch:
        """Poll on a daemon thread, from now on (the peak is recorded also when the bound
        is 0)."""
        WATCHES.append(self)
        self._thread = threading.Thread(
            target=self._run, name=f"rss-watch-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def sample(self) -> int:
        """Measure once; records the peak, and acts once when it is above the bound."""
        rss = rss_bytes(self.pid)
        self.peak_bytes = max(self.peak_bytes, rss)
        if self.limit_mb > 0 and rss > self.limit_mb * _MB and self.exceeded is None:
            self.exceeded = (
                f"{self.name} (pid {self.pid}) reached {rss / _MB:,.0f} MB of resident memory, "
                f"above its bound of {self.limit_mb:,} MB ({limit_env(self.backend)} or "
                f"{LIMIT_ENV}; 0 turns the watch off): the server was stopped, and with it the "
                "run that started it, before the machine runs out of memory"
            )
            self._on_exceed(self)
        return rss

    def _run(self) -> None:
        while True:
            self.sample()
            if self.exceeded is not None or self._done.wait(self.interval):
                return

    def close(self) -> None:
        """Stop polling (a last sample first, unless the bound was already passed)."""
        if self.exceeded is None and not self._done.is_set():
            with contextlib.suppress(OSError):
                self.sample()
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def check(self) -> None:
        """Raise :class:`ServerMemoryError` if the bound was passed."""
        if self.exceeded is not None:
            raise ServerMemoryError(f"error: {self.exceeded}")

    def stop_run(self) -> None:
        """The default ``on_exceed``: say why, stop the server, interrupt the main thread."""
        print(f"\nerror: {self.exceeded}", file=sys.stderr, flush=True)
        try:
            self._stop_server()
        except Exception as exc:  # the SIGKILL below still frees the memory
            print(f"stopping {self.name} failed ({exc}); killing it", file=sys.stderr)
        kill_group(self.pid)
        interrupt_main_thread()

    def summary(self) -> str:
        bound = f"bound {self.limit_mb:,} MB" if self.limit_mb > 0 else "not bounded"
        return f"{self.name} {self.peak_mb:,.0f} MB ({bound})"


#: Every watch started in this process, in start order.
WATCHES: list[ServerWatch] = []


@contextlib.contextmanager
def watching(
    name: str, pid: int, backend: str, stop: Callable[[], None] | None = None
) -> Iterator[ServerWatch]:
    """Watch the server ``pid`` while the block runs; :class:`ServerMemoryError` on leaving
    it when the bound was passed (chained to whatever the interrupted run raised)."""
    watch = ServerWatch(name, pid, backend, stop=stop).start()
    try:
        yield watch
    except BaseException as exc:
        watch.close()
        if watch.exceeded is not None:
            raise ServerMemoryError(f"error: {watch.exceeded}") from exc
        raise
    watch.close()
    watch.check()


def peaks_line(watches: list[ServerWatch] | None = None) -> str:
    """``Test servers' peak resident memory: moto 512 MB (bound 4,096 MB), …`` or ``""``."""
    chosen = WATCHES if watches is None else watches
    if not chosen:
        return ""
    summaries = ", ".join(w.summary() for w in chosen)
    return (
        f"Test servers' peak resident memory (each one's process tree, polled every "
        f"{POLL_SECONDS:g} s): {summaries}."
    )

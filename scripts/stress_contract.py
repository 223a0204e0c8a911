"""Run the contract suite again and again while every core is kept busy; report every failure.

    python scripts/stress_contract.py                          # 20 runs on sqlite and redis
    python scripts/stress_contract.py --runs 2 sqlite          # fewer runs, other backends
    python scripts/stress_contract.py redis -- -k TestSessions # pytest options after ``--``
    nox -s contract-stress -- --runs 5 sqlite                  # the same through nox
    AGENT_STORES_CONTRACT_EXCLUDE=redis-cluster nox -s contract-stress -- redis  # standalone

A contract test must fail only for something the backend did, never because the machine
was slow. So while the suite runs, CPU hogs (``stress --cpu N`` when installed, else one
pure-Python busy loop per core) compete with it, its servers and its worker processes.

Each run is ``nox -s contract -- BACKEND [PYTEST_ARGS]``: the contract session's own
machinery (its locked environment, its servers, its pytest invocation), nothing copied.
Each run's output is kept (``run-<n>-<backend>.log``); ``report.json`` and ``report.md``
record per run and per label (``redis`` runs ``redis`` and ``redis-cluster``) whether it
passed, how long it took and which tests failed, with their behaviour ids. The last line
printed is the count of failed runs. Exit status 1 if any run failed.

The hogs stop when this script ends, on Ctrl-C or SIGTERM too; a hog whose parent died
(SIGKILL) notices within a fraction of a second and exits by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BACKENDS = ["sqlite", "redis"]
DEFAULT_REPORT = ROOT / ".nox" / "contract-stress"
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
#: How long an interrupted contract run may take to stop its servers before it is killed.
STOP_GRACE_SECONDS = 60

#: One busy loop; it exits once its parent is gone (so a killed script leaves no hog).
HOG_CODE = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""

LABEL_LINE = re.compile(r"contract suite on ([\w.-]+):")
FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+::\S+)")
PYTEST_TOTAL = re.compile(r"^=+ (.+) in ([\d.]+)s(?: \([\d:]+\))? =+$")
#: the contract session's own line naming what it left out (``session.log`` in noxfile.py)
EXCLUDED_LINE = re.compile(r"contract summary: EXCLUDED by [^:]+: \[([^\]]*)\]")
SUITE_TEST = re.compile(r"(?:^|/)test_(\w+)\.py::\w+::test_(\w+)")


@dataclass
class LabelResult:
    """One pytest run of the contract (a backend may run several: ``redis-cluster``)."""

    label: str
    failed: list[str] = field(default_factory=list)
    outcome: str = ""
    seconds: float | None = None


@dataclass
class RunResult:
    """One ``nox -s contract -- BACKEND`` run."""

    run: int
    backend: str
    returncode: int
    seconds: float
    log: str
    labels: list[LabelResult] = field(default_factory=list)
    #: the targets the contract session said it left out (its option or environment)
    excluded: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    def failed_tests(self) -> list[tuple[str, str]]:
        return [(label.label, test) for label in self.labels for test in label.failed]


def behaviour_of(nodeid: str) -> str | None:
    """The behaviour id of a suite test (``suite/test_sessions.py::...::test_x`` -> ``sessions.x``)."""
    found = SUITE_TEST.search(nodeid.split("[", 1)[0])
    return f"{found[1]}.{found[2]}" if found else None


def parse_log(text: str) -> list[LabelResult]:
    """Per contract label, the failing tests and pytest's closing line of that label's run."""
    labels: list[LabelResult] = []
    for raw in text.splitlines():
        line = raw.strip()
        if match := LABEL_LINE.search(line):
            labels.append(LabelResult(match[1]))
            continue
        if not labels:
            continue
        if match := FAILED_LINE.match(line):
            if match[2] not in labels[-1].failed:
                labels[-1].failed.append(match[2])
        elif match := PYTEST_TOTAL.match(line):
            labels[-1].outcome, labels[-1].seconds = match[1], float(match[2])
    return labels


class Hogs:
    """CPU hogs, one per core: ``stress --cpu N`` or pure-Python busy loops."""

    def __init__(self, count: int, kind: str) -> None:
        self.count = count
        self.kind = kind
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, expected_seconds: float) -> None:
        if self.count <= 0:
            return
        if self.kind == "stress":
            # Its own --timeout bounds it even if this script is killed without cleanup.
            timeout = f"{int(expected_seconds) + 600}s"
            self.processes.append(
                subprocess.Popen(
                    ["stress", "--cpu", str(self.count), "--timeout", timeout],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            return
        for _ in range(self.count):
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG_CODE, str(os.getpid())],
                    start_new_session=True,
                )
            )

    def alive(self) -> int:
        return sum(1 for process in self.processes if process.poll() is None)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                continue
            try:
                # Each hog leads its own process group: stress's workers go with it.
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            process.wait()
        self.processes.clear()

    def describe(self) -> str:
        if self.count <= 0:
            return "no load"
        if self.kind == "stress":
            return f"stress --cpu {self.count}"
        return f"{self.count} pure-Python busy loop(s)"


class Interrupted(Exception):
    """SIGTERM (or SIGINT) arrived: stop the current run and the hogs, then report."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run_contract(
    run: int, backend: str, pytest_args: list[str], folder: Path, nox: list[str]
) -> RunResult:
    """``nox -s contract -- BACKEND PYTEST_ARGS``, its output written to a log file."""
    log = folder / f"run-{run:02d}-{backend}.log"
    command = [*nox, "-s", "contract", "--", backend, *pytest_args]
    started = time.monotonic()
    with log.open("wb") as out:
        # A session of its own: a Ctrl-C at the terminal reaches this script only, which
        # passes exactly one SIGINT on (a second one would cut nox's cleanup short).
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait()
        except BaseException:
            # Let nox stop the servers it started (its context managers run on SIGINT).
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    excluded = EXCLUDED_LINE.search(text)
    names = re.findall(r"'([^']+)'", excluded.group(1)) if excluded else []
    return RunResult(run, backend, returncode, round(seconds, 1), log.name, parse_log(text), names)


@dataclass
class Summary:
    """What the whole stress run found."""

    load: str
    cpus: int
    backends: list[str]
    pytest_args: list[str]
    runs_asked: int
    #: What was tested: ``git describe --always --dirty`` of the checkout, and when.
    commit: str = ""
    started: str = ""
    #: Targets the runs left out (``--exclude`` or its environment variable, which each
    #: run inherits), as the contract session reported them.
    excluded: str = ""
    interrupted: str | None = None
    runs_done: int = 0
    failed_runs: int = 0
    failed_tests: list[str] = field(default_factory=list)
    seconds_per_backend: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def of(cls, base: Summary, results: list[RunResult]) -> Summary:
        failed = [r for r in results if not r.passed]
        base.runs_done = max((r.run for r in results), default=0)
        base.failed_runs = len(failed)
        base.failed_tests = sorted(
            {behaviour_of(test) or test for r in failed for _, test in r.failed_tests()}
        )
        base.excluded = ", ".join(sorted({n for r in results for n in r.excluded}))
        base.seconds_per_backend = {
            backend: [r.seconds for r in results if r.backend == backend]
            for backend in base.backends
        }
        return base


def markdown(summary: Summary, results: list[RunResult]) -> str:
    """The report as a Markdown page: the totals, then one table row per run."""
    lines = [
        "# Contract under CPU load",
        "",
        f"- commit: {summary.commit or '?'}; started {summary.started or '?'}",
        f"- load: {summary.load} on {summary.cpus} CPU(s)",
        f"- backends: {', '.join(summary.backends)}"
        + (f" (excluded: {summary.excluded})" if summary.excluded else "")
        + "; "
        f"pytest arguments: {' '.join(summary.pytest_args) or '-'}",
        f"- runs: {summary.runs_done} of {summary.runs_asked} per backend"
        + (f" (interrupted by {summary.interrupted})" if summary.interrupted else ""),
        f"- **failed runs: {summary.failed_runs} of {len(results)}**"
        + (f": {', '.join(summary.failed_tests)}" if summary.failed_tests else ""),
        "",
        "| run | backend | result | seconds | per label (pytest's summary, its seconds) | failed tests |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        per_label = "; ".join(
            f"{label.label}: {label.outcome or '?'}"
            + (f" ({label.seconds:.0f} s)" if label.seconds is not None else "")
            for label in result.labels
        ).replace("|", "\\|")
        failed = "<br>".join(
            f"`{behaviour_of(test) or test}` ({label})" for label, test in result.failed_tests()
        )
        verdict = "pass" if result.passed else f"FAIL (exit {result.returncode})"
        lines.append(
            f"| {result.run} | {result.backend} | {verdict} | {result.seconds:.0f} | "
            f"{per_label or '-'} | {failed or '-'} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options and, after ``--``, pytest's; ``hog`` resolved to what will run."""
    pytest_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, pytest_args = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="stress_contract.py",
        description="Run the contract N times per backend under CPU load; report failures.",
    )
    parser.add_argument("backends", nargs="*", default=DEFAULT_BACKENDS, help="backend names")
    parser.add_argument("--runs", type=int, default=20, help="runs per backend (default 20)")
    parser.add_argument(
        "--hogs", type=int, default=CPUS or 1, help="busy loops (default: one per core)"
    )
    parser.add_argument(
        "--hog",
        choices=["auto", "stress", "python"],
        default="auto",
        help="stress --cpu when installed (auto), or pure-Python busy loops",
    )
    parser.add_argument(
        "--report", type=Path, default=DEFAULT_REPORT, help=f"folder (default {DEFAULT_REPORT})"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.hog == "auto":
        args.hog = "stress" if shutil.which("stress") else "python"
    elif args.hog == "stress" and not shutil.which("stress"):
        parser.error("--hog stress: stress is not installed")
    return args, pytest_args


def checkout_commit() -> str:
    """The commit under test, ``-dirty`` when the checkout has uncommitted changes."""
    try:
        found = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return found.stdout.strip()


def write_report(folder: Path, base: Summary, results: list[RunResult]) -> Summary:
    """report.json and report.md as they stand: after every run, so a killed stress run
    still leaves the runs it finished on record."""
    summary = Summary.of(base, results)
    report = {**asdict(summary), "results": [{**asdict(r), "passed": r.passed} for r in results]}
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(summary, results))
    return summary


def run_all(
    args: argparse.Namespace,
    pytest_args: list[str],
    hogs: Hogs,
    nox: list[str],
    on_run: Callable[[list[RunResult]], object] = lambda results: None,
) -> tuple[list[RunResult], str | None]:
    """Every run under the hogs, each printed (and ``on_run``) as it ends; stops early on
    SIGINT/SIGTERM."""
    results: list[RunResult] = []
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        hogs.start(expected_seconds=args.runs * len(args.backends) * 1800)
        for run in range(1, args.runs + 1):
            for backend in args.backends:
                if hogs.alive() < len(hogs.processes):
                    raise RuntimeError("a CPU hog died: the load is not what it should be")
                result = run_contract(run, backend, pytest_args, args.report, nox)
                results.append(result)
                print(progress_line(result, args.runs), flush=True)
                on_run(results)
    except Interrupted as exc:
        print(f"contract-stress: interrupted by {exc}", flush=True)
        return results, str(exc)
    finally:
        hogs.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return results, None


def progress_line(result: RunResult, runs: int) -> str:
    """One run's verdict, and each failed test with its behaviour id."""
    verdict = "passed" if result.passed else f"FAILED (exit {result.returncode})"
    return (
        f"run {result.run}/{runs} {result.backend}: {verdict} in {result.seconds:.0f} s"
        + "".join(
            f"\n    {label}: {behaviour_of(test) or ''} {test}"
            for label, test in result.failed_tests()
        )
    )


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    folder: Path = args.report
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("run-*.log"):
        old.unlink()
    # The interpreter running this script runs nox too (``uv run nox`` or nox's own venv).
    nox = [sys.executable, "-m", "nox", "--no-color"]
    hogs = Hogs(args.hogs, args.hog)
    print(
        f"contract-stress: {args.runs} run(s) on {', '.join(args.backends)} under "
        f"{hogs.describe()} ({CPUS} CPU(s)); logs and report in {folder}",
        flush=True,
    )
    base = Summary(
        hogs.describe(),
        CPUS or 1,
        args.backends,
        pytest_args,
        args.runs,
        commit=checkout_commit(),
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    results, interrupted = run_all(
        args, pytest_args, hogs, nox, on_run=lambda done: write_report(folder, base, done)
    )
    base.interrupted = interrupted
    summary = write_report(folder, base, results)
    for backend, seconds in summary.seconds_per_backend.items():
        if seconds:
            print(f"{backend}: {min(seconds):.0f}-{max(seconds):.0f} s per run (nox included)")
    print(f"contract-stress: {summary.failed_runs} of {len(results)} run(s) failed")
    if interrupted:
        return 130
    return 1 if summary.failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())

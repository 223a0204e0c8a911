"""Resumable at every crash point: a two-tool harness run is SIGKILLed and resumed.

The run (``resume_worker.py``): model → alpha → model → beta → model → "done". A real
process kills itself with SIGKILL before, inside and after each tool and inside each
model call; a new process resumes it with ``resume_run``. Each tool's effect is logged by
the tool itself, so "ran exactly once" is read from what actually happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("resume_worker.py")
sys.path.insert(0, str(WORKER.parent))
from resume_worker import CRASH_POINTS  # noqa: E402

ANSWER = "done ['alpha(1)', 'beta(2)']"


def _backends() -> list[Any]:
    out: list[Any] = [pytest.param("sqlite", id="sqlite")]
    for name, env in (
        ("redis", "AGENT_STORES_TEST_REDIS_URL"),
        ("postgresql", "AGENT_STORES_TEST_POSTGRES_URL"),
    ):
        out.append(
            pytest.param(
                name,
                id=name,
                # Skipped only outside CI: under CI (``nox -s tests`` sets the URL) a
                # missing server is a failure, not a quiet skip.
                marks=pytest.mark.skipif(
                    not os.environ.get(env) and not os.environ.get("CI"),
                    reason=f"{env} is not set",
                ),
            )
        )
    return out


@pytest.fixture
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend = request.param
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    env = {"redis": "AGENT_STORES_TEST_REDIS_URL", "postgresql": "AGENT_STORES_TEST_POSTGRES_URL"}
    if not os.environ.get(env[backend]):
        pytest.fail(f"{env[backend]} is not set: under CI every crash point runs on {backend}")
    return os.environ[env[backend]]


def worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def crash(url: str, run_id: str, point: str, log: Path) -> None:
    killed = worker("run", url, run_id, point, str(log))
    assert killed.returncode == -9, f"expected SIGKILL at {point}: {killed.stderr[-2000:]}"


def resume(url: str, run_id: str, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return worker("resume", url, run_id, "-", str(log), *extra)


def effects(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# Inside a tool the effect happened but no result was stored: the operator, who can see
# the effect, resolves the call with its result, so the tool is not run again.
DECISIONS = {"inside-alpha": {"a1": "alpha(1)"}, "inside-beta": {"b1": "beta(2)"}}


# Every point on SQLite; on the networked backends the points where the store's state
# differs (no effect, uncertain effect, stored result, settled snapshot), to bound run time.
NETWORKED_POINTS = ("before-alpha", "inside-alpha", "after-alpha", "model-2")


def _matrix() -> list[Any]:
    out: list[Any] = []
    for backend in _backends():
        for point in CRASH_POINTS:
            if backend.id == "sqlite" or point in NETWORKED_POINTS:
                out.append(
                    pytest.param(
                        *backend.values, point, marks=backend.marks, id=f"{backend.id}-{point}"
                    )
                )
    return out


@pytest.mark.parametrize(("url", "point"), _matrix(), indirect=["url"])
def test_killed_at_each_point_resumes_and_runs_each_tool_once(
    url: str, point: str, tmp_path: Path
) -> None:
    run_id = f"crash-{point}-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "effects.log"
    crash(url, run_id, point, log)
    decisions = DECISIONS.get(point)
    done = resume(url, run_id, log, *([json.dumps(decisions)] if decisions else []))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"output": ANSWER}
    assert sorted(effects(log)) == ["alpha effect", "beta effect"]


@pytest.mark.parametrize("url", _backends()[:1], indirect=True)
def test_uncertain_effect_needs_a_decision(url: str, tmp_path: Path) -> None:
    """Killed inside a non-idempotent tool: resuming without a decision refuses (typed) and runs nothing."""
    run_id = f"uncertain-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "effects.log"
    crash(url, run_id, "inside-alpha", log)
    refused = resume(url, run_id, log)
    assert refused.returncode != 0
    assert "RUN_UNCERTAIN_EFFECT" in refused.stderr and "'a1'" in refused.stderr
    assert effects(log) == ["alpha effect"]
    retried = resume(url, run_id, log, json.dumps({"a1": "retry"}))
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert sorted(effects(log)) == ["alpha effect", "alpha effect", "beta effect"]


@pytest.mark.parametrize("url", _backends()[:1], indirect=True)
def test_idempotent_tool_is_retried_and_denied_one_is_not_run(url: str, tmp_path: Path) -> None:
    """An idempotent tool caught mid-execution runs again; a denied one is answered with a refusal."""
    log = tmp_path / "effects.log"
    first = f"idem-{uuid.uuid4().hex[:8]}"
    crash(url, first, "inside-beta", log)
    again = resume(url, first, log, "{}", "beta")
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(effects(log)) == ["alpha effect", "beta effect", "beta effect"]

    log.unlink()
    second = f"deny-{uuid.uuid4().hex[:8]}"
    crash(url, second, "inside-beta", log)
    denied = resume(url, second, log, json.dumps({"b1": "deny"}))
    assert denied.returncode == 0, denied.stderr[-3000:]
    output = json.loads(denied.stdout.splitlines()[-1])["output"]
    assert "alpha(1)" in output and "refused" in output
    assert sorted(effects(log)) == ["alpha effect", "beta effect"]

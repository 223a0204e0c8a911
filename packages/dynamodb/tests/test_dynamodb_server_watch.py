"""The test servers' memory watch (``scripts/servers/watch.py``) and moto's launcher.

``nox -s bench`` once drove the moto server it started to 22 GB of resident memory
(issue 59): moto tracked every model object it ever made, and ``TransactWriteItems``
deep-copies the whole table each time. Now the launcher turns the tracking off, and every
server the project starts is watched: above its bound it is killed and the run that
started it stops, saying why.

The watch is tested on small real processes: a "server" whose child allocates memory
above a tiny bound, watched from a "run" of its own (a Python process: the watch
interrupts the main thread of the run that started the server, which must not be
pytest's).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from agent_stores import StoreURL
from dynamodb_test_support import REPO_ROOT, load_server_module

WATCH_SCRIPT = REPO_ROOT / "scripts" / "servers" / "watch.py"

#: A "server" that starts a child (in its session) which holds MB megabytes, touched page
#: by page so they are resident, and prints its pid; both sleep until killed.
HOG = textwrap.dedent(
    """
    import subprocess, sys, time
    if sys.argv[1] == "child":
        block = bytearray(int(sys.argv[2]) * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        print("allocated", flush=True)
        time.sleep(600)
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], "child", sys.argv[2]])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def load_watch() -> ModuleType:
    """``scripts/servers/watch.py``, under the name the server scripts load it by."""
    name = "agent_stores_servers_watch"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, WATCH_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def hog() -> Iterator[subprocess.Popen[str]]:
    """A "server" (its own session) whose child holds 64 MB; stopped after the test."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOG, "parent", "64", HOG],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        load_watch().kill_group(process.pid)
        process.wait(timeout=30)


pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")


def test_a_server_above_its_bound_stops_the_run_that_started_it_with_the_message() -> None:
    """The run starts a server whose child allocates 64 MB; with a 48 MB bound (the two Pythons alone take some 20 MB) the watch
    kills the server (its child too) and the run, blocked in a wait, exits at once with
    the message, not after its wait."""
    run = textwrap.dedent(
        f"""
        import importlib.util, subprocess, sys, time
        spec = importlib.util.spec_from_file_location("agent_stores_servers_watch", {str(WATCH_SCRIPT)!r})
        watch = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = watch
        spec.loader.exec_module(watch)
        hog = {HOG!r}
        server = subprocess.Popen([sys.executable, "-c", hog, "parent", "64", hog],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        child = int(server.stdout.readline())
        print("child", child, flush=True)
        with watch.watching("the hog server", server.pid, "hog"):
            server.wait(timeout=300)  # the run's work: far longer than the test waits
        print("not stopped", flush=True)
        """
    )
    env = dict(os.environ, AGENT_STORES_HOG_SERVER_RSS_LIMIT_MB="48")
    env.pop("AGENT_STORES_SERVER_RSS_LIMIT_MB", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", run], capture_output=True, text=True, env=env, timeout=120
    )
    took = time.monotonic() - started
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "not stopped" not in result.stdout
    assert "the hog server (pid" in result.stderr
    assert "above its bound of 48 MB" in result.stderr
    assert "AGENT_STORES_HOG_SERVER_RSS_LIMIT_MB" in result.stderr
    assert "the server was stopped, and with it the run that started it" in result.stderr
    assert "Traceback" not in result.stderr.split("error: the hog server")[-1]
    assert took < 60
    child = int(result.stdout.split("child", 1)[1].split()[0])
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the server's child (the one holding the memory) still runs"


def test_the_peak_of_the_whole_tree_is_recorded_under_the_bound(
    hog: subprocess.Popen[str],
) -> None:
    watch = load_watch()
    assert hog.stdout is not None
    hog.stdout.readline()  # the child's pid: it runs
    acted: list[object] = []
    watched = watch.ServerWatch(
        "the hog server", hog.pid, "hog", limit=4096, interval=0.05, on_exceed=acted.append
    ).start()
    try:
        deadline = time.monotonic() + 60
        while watched.peak_mb < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watched.close()
    assert 64 <= watched.peak_mb < 4096
    assert not acted and watched.exceeded is None
    watched.check()  # under the bound: no error
    line = watch.peaks_line([watched])
    assert line.startswith("Test servers' peak resident memory")
    assert f"the hog server {watched.peak_mb:,.0f} MB (bound 4,096 MB)" in line
    assert hog.poll() is None  # under its bound a server is left alone


def test_a_bound_passed_calls_on_exceed_once_and_check_raises(
    hog: subprocess.Popen[str],
) -> None:
    watch = load_watch()
    acted: list[object] = []
    watched = watch.ServerWatch(
        "the hog server", hog.pid, "hog", limit=48, interval=0.05, on_exceed=acted.append
    ).start()
    try:
        deadline = time.monotonic() + 60
        while not acted and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # more polls: still one call
    finally:
        watched.close()
    assert acted == [watched]
    with pytest.raises(watch.ServerMemoryError, match="above its bound of 48 MB"):
        watched.check()
    assert isinstance(watch.ServerMemoryError("x"), SystemExit)


def test_the_bound_comes_from_the_servers_variable_then_the_shared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = load_watch()
    monkeypatch.delenv("AGENT_STORES_SERVER_RSS_LIMIT_MB", raising=False)
    monkeypatch.delenv("AGENT_STORES_DYNAMODB_SERVER_RSS_LIMIT_MB", raising=False)
    assert watch.limit_mb("dynamodb") == 4096
    monkeypatch.setenv("AGENT_STORES_SERVER_RSS_LIMIT_MB", "2000")
    assert watch.limit_mb("dynamodb") == 2000
    monkeypatch.setenv("AGENT_STORES_DYNAMODB_SERVER_RSS_LIMIT_MB", "0")
    assert watch.limit_mb("dynamodb") == 0  # the watch off for moto alone
    assert watch.limit_mb("cosmos") == 2000
    monkeypatch.setenv("AGENT_STORES_SERVER_RSS_LIMIT_MB", "lots")
    with pytest.raises(ValueError, match="AGENT_STORES_SERVER_RSS_LIMIT_MB"):
        watch.limit_mb("cosmos")


def test_the_moto_server_is_watched_and_tracks_no_model_objects() -> None:
    """moto's dashboard lists every object it tracks (``/moto-api/data.json``); the
    launcher turns the tracking off, which kept a copy of the whole table per
    TransactWriteItems, so after writes it lists no DynamoDB objects at all."""
    server = load_server_module()
    if not server.available():
        pytest.fail(f"install moto's server: {server.INSTALL_HINT}")
    import boto3

    watch = load_watch()
    with server.dynamodb_server() as urls:
        watched = watch.WATCHES[-1]
        assert watched.name == server.WATCHED_NAME and watched.limit_mb > 0
        endpoint = StoreURL.parse(urls["dynamodb"]).query_get("endpoint_url")
        assert endpoint is not None
        client = boto3.client(
            "dynamodb",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_table(
            TableName="watched",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for i in range(3):
            client.transact_write_items(
                TransactItems=[{"Put": {"TableName": "watched", "Item": {"k": {"S": f"k{i}"}}}}]
            )
        with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=30) as reply:
            tracked = json.load(reply)
        assert client.scan(TableName="watched")["Count"] == 3
    assert not any(tracked.get("dynamodb", {}).values()), tracked.get("dynamodb")
    assert watched.peak_mb > 0 and watched.exceeded is None

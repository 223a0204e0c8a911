"""``scripts/servers/cosmos.py``: installs that share one cache folder, and servers that
share one machine.

The install tests run the machine's real npm on a local package tarball (offline, a few
seconds); they are skipped where Node.js or npm is missing. Only the 20-line error test
puts a stand-in ``npm`` first on ``PATH``: it prints 3,000 lines and fails, which real
npm does only on a bad day.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cosmos_test_support import SERVERS_SCRIPT, servers

NPM = shutil.which("npm")
needs_npm = pytest.mark.skipif(
    NPM is None or not servers.available(), reason="needs Node.js >= 18 and npm"
)


def _fake_package(folder: Path) -> Path:
    """A tarball of a package named like the test server, holding its ``lib/cli.js``."""
    source = folder / "source"
    (source / "lib").mkdir(parents=True)
    (source / "package.json").write_text(
        '{"name": "@vercel/cosmosdb-server", "version": "0.0.0-test", "files": ["lib"]}'
    )
    (source / "lib" / "cli.js").write_text("console.log('not a server');\n")
    assert NPM is not None
    packed = subprocess.run(
        [NPM, "pack", "--silent", "--pack-destination", str(folder), str(source)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return folder / packed.stdout.strip().splitlines()[-1]


def _counting_npm(folder: Path, count_file: Path) -> Path:
    """A ``bin`` folder whose ``npm`` notes each ``install``, waits a little, then runs the
    real npm: the wait makes a second installer arrive while the first one works."""
    assert NPM is not None
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    script = bin_dir / "npm"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = install ]; then echo "$$" >> "{count_file}"; sleep 1; fi\n'
        f'exec "{NPM}" "$@"\n'
    )
    script.chmod(0o755)
    return bin_dir


@needs_npm
def test_two_installs_at_once_into_an_empty_cache_both_succeed(tmp_path: Path) -> None:
    """Two ``cosmos.py install`` processes start together on one empty cache folder: both
    succeed and print the same cli.js, npm runs once (the second waits for the lock and
    finds the install done), and no temporary folder is left behind."""
    cache = tmp_path / "cache"  # does not exist yet: the installers create it
    count_file = tmp_path / "npm-installs"
    bin_dir = _counting_npm(tmp_path, count_file)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        servers.DIR_ENV: str(cache),
        servers.PACKAGE_ENV: str(_fake_package(tmp_path)),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(SERVERS_SCRIPT), "install"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    printed = {out.strip() for out, _ in results}
    assert len(printed) == 1
    cli = Path(printed.pop())
    assert cli.is_file() and cli.is_relative_to(cache)
    assert len(count_file.read_text().split()) == 1
    leftovers = sorted(p.name for p in cache.iterdir())
    assert leftovers == sorted([servers.LOCK_NAME, cli.relative_to(cache).parts[0]])


@needs_npm
def test_installs_in_one_process_wait_for_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock also holds between threads of one process (flock is per open file)."""
    count_file = tmp_path / "npm-installs"
    bin_dir = _counting_npm(tmp_path, count_file)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(servers.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(servers.PACKAGE_ENV, str(_fake_package(tmp_path)))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        found = list(pool.map(lambda _: servers.ensure_installed(), range(3)))
    assert len(set(found)) == 1 and found[0].is_file()
    assert len(count_file.read_text().split()) == 1


@needs_npm
def test_a_failed_install_reports_its_last_20_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npm failing with 3,000 lines of output: the error carries the last 20 and names a
    log file holding all of them; nothing half-installed stays in the cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "npm"
    fake.write_text(
        "#!/bin/sh\n"
        'i=1; while [ $i -le 3000 ]; do echo "npm output line $i"; i=$((i+1)); done\n'
        "echo 'npm error the last line' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(servers.DIR_ENV, str(cache))
    with pytest.raises(servers.ServerError) as caught:
        servers.ensure_installed()
    message = str(caught.value)
    assert len(message.splitlines()) <= 23  # a summary, 20 lines, the log's path
    assert "npm error the last line" in message
    assert "npm output line 2982" in message and "npm output line 2981" not in message
    log = Path(message.rsplit("the whole log: ", 1)[1].strip())
    assert log.is_file() and log.parent == cache
    text = log.read_text()
    assert "npm output line 1\n" in text and "npm output line 3000" in text
    assert sorted(p.name for p in cache.iterdir()) == sorted([servers.LOCK_NAME, log.name])


@needs_npm
def test_an_invalid_package_spec_fails_with_the_tail_of_real_npm_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real npm on a spec that cannot exist (no network needed): a ServerError with
    npm's own last lines and the log's path, and the next call tries again."""
    monkeypatch.setenv(servers.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(servers.PACKAGE_ENV, f"file:{tmp_path / 'no-such-package'}")
    for _ in range(2):
        with pytest.raises(servers.ServerError, match="ENOENT") as caught:
            servers.ensure_installed()
        assert "the whole log: " in str(caught.value)
        assert len(str(caught.value).splitlines()) <= 23


class _Answering(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"someone else's server")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering_port() -> Iterator[int]:
    """A port on which another program answers HTTP 200, as another run's server would."""
    server = http.server.ThreadingHTTPServer((servers.HOST, 0), _Answering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(not servers.available(), reason="needs Node.js >= 18 and npm")
def test_another_server_on_the_port_never_passes_for_ours(
    tmp_path: Path, answering_port: int
) -> None:
    """Asked for a port where something else answers, start fails (the process could not
    bind) instead of handing out the other server's URL."""
    server = servers.CosmosServer(answering_port, tmp_path / "server.log")
    with pytest.raises(servers.ServerError, match="did not start"):
        server.start()
    assert server.pid is None


@pytest.mark.skipif(not servers.available(), reason="needs Node.js >= 18 and npm")
def test_two_servers_get_two_ports_of_their_own() -> None:
    """Servers started together each bind a port the kernel picks (``-p 0``): distinct,
    each reported by the server itself."""
    with servers.cosmos_server() as first, servers.cosmos_server() as second:
        ports = {url.split("//")[1].split("/")[0] for url in (first["cosmos"], second["cosmos"])}
        assert len(ports) == 2

"""``scripts/servers/firestore.py`` on a shared machine: an emulator of another run on the
port never passes for ours, a port taken between picking and binding is picked again, and
``start`` on a running emulator never clears data another run may be using."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_stores import open_kv
from firestore_test_support import SERVER_SCRIPT, server

pytestmark = pytest.mark.skipif(
    not server.available(), reason="needs gcloud, its Firestore emulator and Java"
)


class _SaysOk(http.server.BaseHTTPRequestHandler):
    """Answers like an emulator's root page (``Ok``), as another run's emulator would."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"Ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def taken_port() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer((server.HOST, 0), _SaysOk)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_another_emulator_on_the_port_never_passes_for_ours(
    tmp_path: Path, taken_port: int
) -> None:
    """Something answers ``Ok`` on the port: our emulator cannot bind it, and start says
    so instead of handing out the other one's URL."""
    assert server.answers(taken_port)
    emulator = server.FirestoreEmulator(taken_port, tmp_path)
    with pytest.raises(server.PortTakenError, match=str(taken_port)):
        emulator.start()
    assert emulator.pgid is None  # stopped: nothing left running


def test_a_port_taken_before_binding_is_picked_again(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first free port picked is taken by the time the emulator binds it: start_emulator
    picks another one and the emulator serves there."""
    real = server.free_port
    picks = iter([taken_port])
    monkeypatch.setattr(server, "free_port", lambda: next(picks, None) or real())
    emulator = server.start_emulator(tmp_path)
    try:
        assert emulator.port != taken_port and server.answers(emulator.port)
    finally:
        emulator.stop()


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SERVER_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return done.stdout


async def test_start_on_a_running_emulator_keeps_the_data(tmp_path: Path) -> None:
    """A second ``start`` on the same state folder reuses the emulator with a new prefix and
    leaves what the first run wrote in place (only ``reset`` clears)."""
    state = str(tmp_path / "state")
    first = json.loads(_cli("--state-dir", state, "--json", "start"))["firestore"]
    try:
        async with open_kv(first) as kv:
            await kv.create("s", "k", b"still here")
        second = json.loads(_cli("--state-dir", state, "--json", "start"))["firestore"]
        assert second != first and second.split("?")[0] == first.split("?")[0]
        async with open_kv(first) as kv:
            entry = await kv.get("s", "k")
            assert entry is not None and entry.value == b"still here"
        _cli("--state-dir", state, "reset")
        async with open_kv(first) as kv:
            assert await kv.get("s", "k") is None
    finally:
        _cli("--state-dir", state, "stop")

"""A TCP front for the Cosmos test server: optionally TLS with a certificate of our own (as
Microsoft's emulator serves a self-signed one), and able to go down and come back on the
same port (as a server restarting: connections refused meanwhile).

Also makes the certificates: a CA and a server certificate it signed for 127.0.0.2, with
the ``openssl`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA certificate (what a client trusts: ca_file=)
    cert: Path  # the server certificate, for 127.0.0.2, signed by the CA
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path, ip: str = "127.0.0.2", name: str = "test") -> Certificates:
    """A CA and a server certificate for ``ip`` signed by it (valid two days)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem",
        "-subj", f"/CN=agent-stores {name} CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.csr", "-subj", f"/CN={ip}",
        cwd=folder,
    )  # fmt: skip
    (folder / f"{name}.ext").write_text(
        f"subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem",
        "-CAkey", f"{name}-ca.key", "-CAcreateserial", "-days", "2",
        "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=folder,
    )  # fmt: skip
    return Certificates(folder / f"{name}-ca.pem", folder / f"{name}.pem", folder / f"{name}.key")


class TCPFront:
    """Listens on ``host`` (TLS when given certificates) and forwards to ``target``.

    :meth:`down` closes the listening socket and every connection (new ones are refused);
    :meth:`up` listens again on the same port.
    """

    def __init__(
        self, target: tuple[str, int], host: str = "127.0.0.1", tls: Certificates | None = None
    ) -> None:
        self.target = target
        self.host = host
        self.port = 0
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(tls.cert, tls.key)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def up(self) -> TCPFront:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._writers.add(client_w)
        server_w: asyncio.StreamWriter | None = None
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
            self._writers.add(server_w)

            async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()

            await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            client_w.close()
            self._writers.discard(client_w)
            if server_w is not None:
                server_w.close()
                self._writers.discard(server_w)

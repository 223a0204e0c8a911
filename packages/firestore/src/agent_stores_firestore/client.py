"""The ``AsyncClient`` a store opens from a URL: built off the event loop, on a channel it owns.

google-cloud-firestore's ``AsyncClient`` resolves Application Default Credentials in its
constructor (a blocking look-up that probes the metadata server: seconds, when none are
found), reaches an emulator only through the ``FIRESTORE_EMULATOR_HOST`` variable, builds
its gRPC channel itself (no interceptors, the process-wide subchannel pool, gRPC's default
reconnect backoff of up to two minutes) and has no public ``close``. So a store opened from
a URL:

* builds its client in a worker thread (:func:`build_client`, awaited through
  ``asyncio.to_thread`` on first use), never on the event loop;
* passes the endpoint as ``client_options.api_endpoint``, with anonymous credentials for
  an emulator, and never touches ``os.environ``;
* owns its channel (:class:`StoreClient`): plaintext for an emulator, TLS with the
  credentials otherwise, with the store's interceptors (the fault injector), a subchannel
  pool of its own (another client in the process never inherits a broken connection),
  a short reconnect backoff and keepalive pings, and a fresh channel after a call that
  got no answer in time (:meth:`StoreClient.recycle`), so a healed network is used at once;
* closes that channel with grpc's public ``Channel.close``.

The channel is given to the client through its GAPIC layer: a
``FirestoreGrpcAsyncIOTransport(channel=…)`` inside a ``FirestoreAsyncClient`` (both public),
returned by the lazy ``_firestore_api`` getter the high-level client reads on every call
(the one hook ``AsyncClient`` offers for a custom channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud.firestore import AsyncClient
from google.cloud.firestore_v1.services.firestore import FirestoreAsyncClient
from google.cloud.firestore_v1.services.firestore.transports.grpc_asyncio import (
    FirestoreGrpcAsyncIOTransport,
)

from .config import CREDENTIALS_ENV, FirestoreSettings

#: gRPC channel options: unlimited messages (as google-cloud-firestore sets), keepalive
#: pings every 30 s while calls are open (Google's own setting) answered within 10 s, a
#: subchannel pool per channel, and reconnect attempts at most 2 s apart. gRPC also takes
#: ``min_reconnect_backoff_ms`` as the connection attempt's timeout (default 20 s): a peer
#: that accepts and never sends its HTTP/2 SETTINGS fails the attempt after 2 s.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 2_000),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


#: What the emulator wants for admin calls (ListDocuments); google-cloud-firestore sends the
#: same when it reaches an emulator through FIRESTORE_EMULATOR_HOST.
EMULATOR_AUTH = ("authorization", "Bearer owner")


def _with_metadata(details: Any, pair: tuple[str, str]) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    if pair[0] not in metadata:
        metadata.add(*pair)
    return details._replace(metadata=metadata)


class _EmulatorAuthUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_metadata(details, EMULATOR_AUTH), request)


class _EmulatorAuthStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_metadata(details, EMULATOR_AUTH), request)


def emulator_auth() -> list[Any]:
    """Interceptors adding the emulator's owner token to every call (grpc.aio files an
    interceptor under the first of its kinds only: one per kind)."""
    return [_EmulatorAuthUnary(), _EmulatorAuthStream()]


class StoreClient(AsyncClient):
    """An ``AsyncClient`` on a gRPC channel it creates, replaces and closes itself."""

    def __init__(
        self,
        *,
        project: str,
        database: str,
        credentials: Credentials,
        endpoint: str,
        plaintext: bool,
        interceptors: Sequence[Any] = (),
    ) -> None:
        super().__init__(
            project=project,
            credentials=credentials,
            database=database,
            client_options={"api_endpoint": endpoint},
        )
        self._endpoint = endpoint
        self._plaintext = plaintext
        self._interceptors = list(interceptors)
        self._channel: grpc.aio.Channel | None = None
        self._api: FirestoreAsyncClient | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Bumped whenever the channel is replaced (see :meth:`recycle`).
        self.generation = 0

    def _new_channel(self) -> grpc.aio.Channel:
        options = list(CHANNEL_OPTIONS)
        if self._plaintext:
            return grpc.aio.insecure_channel(
                self._endpoint,
                options=options,
                interceptors=[*emulator_auth(), *self._interceptors],
            )
        channel: grpc.aio.Channel = FirestoreGrpcAsyncIOTransport.create_channel(
            self._endpoint,
            credentials=self._credentials,
            options=options,
            interceptors=self._interceptors or None,
        )
        return channel

    @property
    def _firestore_api(self) -> FirestoreAsyncClient:
        """The GAPIC client on this client's own channel (created on first use)."""
        if self._closed:
            raise RuntimeError("the Firestore client of this store is closed")
        if self._api is None:
            self._channel = self._new_channel()
            transport = FirestoreGrpcAsyncIOTransport(host=self._endpoint, channel=self._channel)
            self._api = FirestoreAsyncClient(transport=transport)
        return self._api

    def recycle(self, generation: int, grace: float) -> None:
        """Use a fresh channel from now on if the current one is still ``generation``.

        Called after a call got no answer in time: the connection under the channel may be
        dead without gRPC knowing yet. Calls already running on the old channel keep it for
        up to ``grace`` seconds, then it is closed.
        """
        if self._closed or generation != self.generation or self._channel is None:
            return
        old, self._channel, self._api = self._channel, None, None
        self.generation += 1
        task = asyncio.get_running_loop().create_task(old.close(grace))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def aclose(self) -> None:
        """Close the channel (and any being retired). Idempotent."""
        self._closed = True
        channel, self._channel, self._api = self._channel, None, None
        if channel is not None:
            await channel.close()
        for task in list(self._retired):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def credentials_file_problem() -> str | None:
    """What is wrong with the file ``$GOOGLE_APPLICATION_CREDENTIALS`` names, or None.

    google-auth reports a missing file as "no credentials found" once the other sources
    have been probed (the metadata server: seconds); the path the user gave is the answer.
    Blocking (a stat): run it in a thread.
    """
    named = os.environ.get(CREDENTIALS_ENV, "")
    if not named:
        return None
    path = Path(named)
    if not path.exists():
        return f"{CREDENTIALS_ENV} names {named}, which does not exist"
    if not path.is_file():
        return f"{CREDENTIALS_ENV} names {named}, which is not a file"
    if not os.access(path, os.R_OK):
        return f"{CREDENTIALS_ENV} names {named}, which this process cannot read"
    return None


def build_client(settings: FirestoreSettings, interceptors: Sequence[Any] = ()) -> StoreClient:
    """A :class:`StoreClient` for ``settings``: blocking (credentials), run it in a thread.

    Raises ``google.auth.exceptions.DefaultCredentialsError`` when no credentials are found.
    """
    if settings.emulator_host is not None:
        return StoreClient(
            project=settings.project,
            database=settings.database,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            endpoint=settings.emulator_host,
            plaintext=True,
            interceptors=interceptors,
        )
    import google.auth

    credentials, _ = google.auth.default(scopes=list(AsyncClient.SCOPE))
    return StoreClient(
        project=settings.project,
        database=settings.database,
        credentials=credentials,
        endpoint=f"{FirestoreAsyncClient.DEFAULT_ENDPOINT or 'firestore.googleapis.com'}:443",
        plaintext=False,
        interceptors=interceptors,
    )

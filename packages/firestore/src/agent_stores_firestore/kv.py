"""``FirestoreKV``: the KV CAS contract on Google Cloud Firestore (``AsyncClient``).

Layout (see ``docs/firestore.md``)::

    COLLECTION/{prefix id}/scopes/{scope id}/entries/{key id}

The scope document is never written: it exists only as the parent of its ``entries``
subcollection, so a scope's scan is one ordered query and a write costs one document
write. Ids are encoded by :mod:`agent_stores_firestore.ids` (reversible, byte order kept).
An entry document holds ``value`` (bytes), ``nonce`` (random per write), and when it
expires ``expires_at`` (float, the core's clock) and ``gc_at`` (a timestamp for a TTL
policy, garbage collection only).

Versions are the document's update time, the write's random ``nonce`` and the expiry,
rendered opaquely. Firestore serializes the writes of one document, so its update times
strictly increase, across a delete and a re-create too; the ``nonce`` makes every write
change the document (Firestore keeps the update time of a write that changes nothing)
and versions unique across documents (the writes of one commit share its timestamp). Every
conditional write is one server-side precondition: ``create`` (exists=false), an update
or delete with ``last_update_time``, and ``commit`` one batch with a precondition per
write. The expiry inside the version lets ``replace``/``delete`` refuse an expired entry
without reading it: the precondition guarantees the document is the one the version
describes.

Transient failures (ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, INTERNAL)
are retried here with jittered exponential backoff inside the store's deadline (the
client's own retries are off, so this is the one place a request is re-sent); each gRPC
attempt's timeout is capped by what is left of the deadline. When a reply was lost and the
retry reports a conflict, the ``nonce`` tells whether the first attempt was applied; when
the nonce is not found the outcome is reported unknown (BackendUnavailableError), never
guessed. A write that creates a document is never re-sent after an ambiguous failure (a
delete in between would let it apply twice): it is read back at once instead. Until the
endpoint has answered once, a refused connection or an unknown host is retried for 0.5 s
only: nothing is there (a wrong ``emulator_host``, an emulator not running).

Every read consumes its gRPC stream to the end (``get_all`` / ``stream``): the client's
``DocumentReference.get`` returns on the first message of a ``BatchGetDocuments`` stream
and leaves the call running, to finish later on whatever event loop is left.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from agent_stores.backend import (
    Check,
    Clock,
    Create,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    StoreURL,
    URLOptions,
    prefix_upper_bound,
    redact,
    within_deadline,
)
from agent_stores.errors import (
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    UnsupportedError,
    ValueTooLargeError,
)

from .config import (
    CREDENTIALS_ENV,
    DEFAULT_DEADLINE,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_PREFIX,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    HARD_MAX_VALUE_BYTES,
    URL_OPTIONS,
    FirestoreSettings,
    check_collection,
    check_prefix,
    parse_url,
)
from .ids import MARKER, MAX_ID_BYTES, checked_id, decode_id, encode_id

if TYPE_CHECKING:
    from google.cloud.firestore import (
        AsyncClient,
        AsyncCollectionReference,
        AsyncDocumentReference,
        AsyncWriteBatch,
    )
    from google.cloud.firestore_v1.base_document import DocumentSnapshot as _Snap

    from .client import StoreClient

    DocumentSnapshot = _Snap[Any]

T = TypeVar("T")

SCOPES = "scopes"
ENTRIES = "entries"
F_VALUE = "value"
F_NONCE = "nonce"
F_EXPIRES = "expires_at"
F_GC = "gc_at"
#: Field a commit's Check clears (it never exists), so the write changes nothing.
F_CHECK = "check"
#: The TTL-policy timestamp trails the entry's own expiry by this much: Firestore's TTL
#: deletion is only garbage collection, and a margin covers clock skew.
GC_GRACE = dt.timedelta(hours=1)
#: Firestore's limits: writes per batch, bytes per commit request (10 MiB, kept clear).
MAX_BATCH_WRITES = 500
MAX_COMMIT_BYTES = 9 << 20
DROP_PAGE = 300
#: How often a write racing with concurrent changes re-reads and tries again.
MAX_ROUNDS = 16

#: Backoff between retries: full jitter up to min(cap, base * 2**try) seconds.
BACKOFF_BASE = 0.05
BACKOFF_CAP = 1.0
#: The retries of one request end this long (at most a tenth of it) before the deadline.
DEADLINE_MARGIN = 0.5
#: A retry is not started with less than this left of the deadline.
MIN_ATTEMPT_SECONDS = 0.25
#: Until the service has answered once, a refused connection (or a host name that does
#: not resolve) is retried for this long only: nothing is there, almost always a wrong
#: ``emulator_host`` or an emulator that is not running. Once the service has answered,
#: the same failure is a restart: retried in full, like any transient fault.
NOTHING_THERE_GRACE_SECONDS = 0.5
#: gRPC's words for "nothing listens there" and "no such host" (never a temporary DNS
#: failure, which is retried).
_REFUSED = ("connection refused",)
_NO_SUCH_HOST = ("domain name not found", "name or service not known", "nodename nor servname")


async def _build_client(settings: FirestoreSettings, interceptors: Sequence[Any]) -> StoreClient:
    """A :class:`~agent_stores_firestore.client.StoreClient` for ``settings``, built in a
    worker thread: resolving Application Default Credentials blocks (it may probe the
    metadata server for seconds), so it never runs on the event loop."""
    from google.auth.exceptions import DefaultCredentialsError

    from .client import build_client, credentials_file_problem

    if settings.emulator_host is None:
        # A file named but missing is a typo to report as such, not as "no credentials".
        problem = await asyncio.to_thread(credentials_file_problem)
        if problem is not None:
            raise ConfigError(detail=f"{settings.describe()}: {problem}")
    try:
        return await asyncio.to_thread(build_client, settings, interceptors)
    except DefaultCredentialsError as exc:
        named = os.environ.get(CREDENTIALS_ENV, "")
        if named:
            reason = redact(str(exc).splitlines()[0] if str(exc) else "")[:300]
            raise ConfigError(
                detail=f"{settings.describe()}: {CREDENTIALS_ENV} names {named}, which could "
                f"not be loaded as Google credentials ({reason or type(exc).__name__}); "
                "point it at a service account key file or another credentials file, or unset it"
            ) from None
        raise ConfigError(
            detail=f"{settings.describe()}: no Google credentials found ({type(exc).__name__}); "
            "set up Application Default Credentials (gcloud auth application-default login, "
            "GOOGLE_APPLICATION_CREDENTIALS or a service account), or emulator_host=HOST:PORT "
            "(or FIRESTORE_EMULATOR_HOST) for the emulator"
        ) from None


class _Attempt:
    """Whether an earlier try of a write may have reached the server (a lost reply).

    ``resend=False`` for a write that creates a document (precondition exists = false):
    if it landed and the document was deleted since, sending it again would apply it a
    second time, so after an ambiguous failure :meth:`FirestoreKV._run` raises
    :class:`_Ambiguous` instead, and the caller reads back.
    """

    __slots__ = ("ambiguous", "resend")

    def __init__(self, *, resend: bool = True) -> None:
        self.ambiguous = False
        self.resend = resend


class _Ambiguous(Exception):
    """A write that must not be re-sent may have been applied (its cause: the failure)."""


def _classify(exc: BaseException) -> tuple[bool, bool] | None:
    """``(retryable, maybe_applied)`` for a failure, or None for an answer the caller reads.

    Conflicts (ALREADY_EXISTS, FAILED_PRECONDITION, NOT_FOUND) are answers, not failures.
    ABORTED (contention) and RESOURCE_EXHAUSTED were not applied; UNAVAILABLE while
    connecting never reached the server; a deadline or a broken stream may have lost the
    reply of a write that ran.
    """
    from google.api_core import exceptions as gex
    from google.auth import exceptions as auth_exc

    if isinstance(exc, gex.AlreadyExists | gex.FailedPrecondition | gex.NotFound):
        return None
    if isinstance(exc, gex.Aborted | gex.ResourceExhausted | gex.TooManyRequests):
        return True, False
    if isinstance(exc, gex.ServiceUnavailable):
        # gRPC says "failed to connect to all addresses" / "Connection refused" when the
        # request never left; "Socket closed" or "Connection reset" may follow a write.
        text = str(exc).lower()
        return True, not ("failed to connect" in text or "connection refused" in text)
    if isinstance(exc, gex.DeadlineExceeded | gex.InternalServerError | gex.Unknown):
        # INTERNAL (InternalServerError) and UNKNOWN may come after the server applied it.
        return True, True
    if isinstance(exc, auth_exc.TransportError):
        return True, False
    if isinstance(exc, gex.GoogleAPICallError | auth_exc.GoogleAuthError):
        return False, False
    if isinstance(exc, OSError | TimeoutError):
        return True, True
    return None


def _note_maybe_applied(attempt: _Attempt, exc: Exception, retryable: bool) -> None:
    """Record that a write may have landed; refuse a retry that must not be re-sent."""
    attempt.ambiguous = True
    if retryable and not attempt.resend:
        raise _Ambiguous() from exc


def _nothing_there(exc: BaseException) -> bool:
    """Whether ``exc`` says no server is at the endpoint at all (refused, unknown host)."""
    from google.api_core import exceptions as gex

    if not isinstance(exc, gex.ServiceUnavailable):
        return False
    text = str(exc).lower()
    return any(words in text for words in (*_REFUSED, *_NO_SUCH_HOST))


def _is_answer(exc: BaseException) -> bool:
    """Whether the server itself produced ``exc`` (a status only a reached server sends)."""
    from google.api_core import exceptions as gex

    if not isinstance(exc, gex.GoogleAPICallError):
        return False
    return not isinstance(exc, gex.ServiceUnavailable | gex.DeadlineExceeded | gex.Unknown)


def _conflict_types() -> tuple[type[Exception], ...]:
    from google.api_core import exceptions as gex

    return (gex.AlreadyExists, gex.FailedPrecondition, gex.NotFound)


def new_nonce() -> str:
    """A random tag for one write (64 bits): part of the version, and proof of authorship."""
    return secrets.token_hex(8)


def render_version(update_time: Any, nonce: str, expires_at: float | None) -> str:
    """The opaque version of a document: update time (seconds.nanos), write nonce, expiry.

    The nonce keeps versions unique across documents too: the writes of one commit share
    its timestamp, and so may independent commits.
    """
    stamp = update_time.timestamp_pb()
    base = f"{stamp.seconds}.{stamp.nanos:09d}.{nonce}"
    return base if expires_at is None else f"{base}~{expires_at!r}"


def parse_version(version: str) -> tuple[Any, float | None] | None:
    """``(update time, expires_at)`` from :func:`render_version`; None when it is not one."""
    from google.protobuf.timestamp_pb2 import Timestamp  # type: ignore[import-untyped]
    from proto.datetime_helpers import DatetimeWithNanoseconds  # type: ignore[import-untyped]

    stamp, _, expiry = version.partition("~")
    parts = stamp.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or len(parts[1]) != 9:
        return None
    seconds, nanos = int(parts[0]), int(parts[1])
    try:
        expires_at = float(expiry) if expiry else None
        when = DatetimeWithNanoseconds.from_timestamp_pb(Timestamp(seconds=seconds, nanos=nanos))
    except (ValueError, OverflowError):
        return None
    return when, expires_at


def _gc_at(expires_at: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(expires_at, dt.UTC) + GC_GRACE


class FirestoreKV(KVStore):
    """KV store on a Firestore database (Native mode).

    Build it with :meth:`from_url` (``firestore://PROJECT/COLLECTION?…``) or
    :meth:`from_client` (a ready ``google.cloud.firestore.AsyncClient``, which the store
    never closes).
    """

    backend_name = "firestore"
    url_options: ClassVar[URLOptions] = URL_OPTIONS
    capabilities = KVCapabilities(commit=True, shared_across_processes=True)

    def __init__(
        self,
        client: AsyncClient | None,
        *,
        collection: str,
        prefix: str = DEFAULT_PREFIX,
        owns_client: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        deadline: float | None = DEFAULT_DEADLINE,
        description: str | None = None,
        clock: Clock | None = None,
        settings: FirestoreSettings | None = None,
        interceptors: Sequence[Any] = (),
    ) -> None:
        super().__init__(clock=clock)
        if not 1024 <= max_value_bytes <= HARD_MAX_VALUE_BYTES:
            raise ConfigError(
                detail=f"max_value_bytes must be between 1024 and {HARD_MAX_VALUE_BYTES}"
            )
        if client is None and settings is None:
            raise ConfigError(detail="FirestoreKV needs a client or the settings to build one")
        self._client: AsyncClient | None = None
        self._settings = settings
        self._interceptors = list(interceptors)
        self._connecting = asyncio.Lock()
        #: True once the service has answered a request (a result or a status of its own)
        self._answered = False
        self._owns_client = owns_client
        self.collection = check_collection(collection)
        self.prefix = check_prefix(prefix)
        self._timeout = float(timeout)
        self._retries = max(0, int(retries))
        self.deadline_seconds = None if deadline is None else float(deadline)
        self.limits = KVLimits(max_value_bytes=max_value_bytes)
        if client is not None:
            self._attach(client)
        project = client.project if client is not None else settings.project if settings else "?"
        self._description = description or (
            f"firestore://{project}/{self.collection}?prefix={prefix} (ready client)"
        )

    def _attach(self, client: AsyncClient) -> None:
        self._client = client
        namespace = client.collection(self.collection).document(encode_id(self.prefix))
        self._scopes_col: AsyncCollectionReference = namespace.collection(SCOPES)
        self._scopes_path = f"{namespace.path}/{SCOPES}/"

    async def _connect(self) -> AsyncClient:
        """The client, built on first use (off the event loop) for a store opened from a URL."""
        if self._client is not None:
            return self._client
        async with self._connecting:
            return self._client or await self._build()

    async def _build(self) -> AsyncClient:
        assert self._settings is not None
        self.check_open()
        client = await _build_client(self._settings, self._interceptors)
        if self.closed:  # closed while the client was being built
            await client.aclose()
            self.check_open()
        self._attach(client)
        return client

    @classmethod
    def from_url(cls, url: StoreURL | str, **options: Any) -> FirestoreKV:
        """Open ``url`` (see :mod:`agent_stores_firestore.config`).

        Options: ``clock``, and ``interceptors`` (``grpc.aio`` client interceptors put on the
        store's channel, e.g. :class:`agent_stores_firestore.faults.FirestoreFaultInjector`'s).
        Nothing is resolved or connected here: the client is built, in a worker thread, by
        the first call (or :meth:`setup`).
        """
        settings = parse_url(url)
        options = dict(options)
        interceptors = list(options.pop("interceptors", None) or ())
        clock = _pop_clock(options)
        return cls(
            None,
            collection=settings.collection,
            prefix=settings.prefix,
            owns_client=True,
            max_value_bytes=settings.max_value_bytes,
            timeout=settings.timeout,
            retries=settings.retries,
            deadline=settings.deadline,
            description=settings.describe(),
            clock=clock,
            settings=settings,
            interceptors=interceptors,
        )

    @classmethod
    def from_client(cls, client: Any, **options: Any) -> FirestoreKV:
        """Wrap a ready ``google.cloud.firestore.AsyncClient``; the store never closes it.

        Options: ``collection`` (default ``agent-stores``), ``prefix``, ``max_value_bytes``,
        ``timeout``, ``retries``, ``deadline`` (seconds, None for unbounded), ``clock``.
        """
        from google.cloud.firestore import AsyncClient, Client

        if isinstance(client, Client):
            raise ConfigError(
                detail="agent-stores needs an asyncio client: pass a "
                "google.cloud.firestore.AsyncClient, not the synchronous Client"
            )
        if not isinstance(client, AsyncClient):
            raise ConfigError(
                detail=f"expected a google.cloud.firestore.AsyncClient, got {type(client).__name__}"
            )
        options = dict(options)
        collection = str(options.pop("collection", "agent-stores"))
        prefix = str(options.pop("prefix", DEFAULT_PREFIX))
        max_value = int(options.pop("max_value_bytes", DEFAULT_MAX_VALUE_BYTES))
        timeout = float(options.pop("timeout", DEFAULT_TIMEOUT))
        retries = int(options.pop("retries", DEFAULT_RETRIES))
        raw_deadline = options.pop("deadline", DEFAULT_DEADLINE)
        deadline = None if raw_deadline is None else float(raw_deadline)
        clock = _pop_clock(options)
        return cls(
            client,
            collection=collection,
            prefix=prefix,
            owns_client=False,
            max_value_bytes=max_value,
            timeout=timeout,
            retries=retries,
            deadline=deadline,
            clock=clock,
        )

    def describe(self) -> str:
        return self._description

    @property
    def client(self) -> AsyncClient:
        """The Firestore client (shared, not owned, when it was passed in).

        A store opened from a URL builds its client on first use: before that (before
        :meth:`setup` or any call) this raises :class:`ConfigError`.
        """
        if self._client is None:
            raise ConfigError(
                detail=f"{self.describe()}: not connected yet (await setup() or make a call first)"
            )
        return self._client

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default true). Firestore has no schema: false only keeps entering
        a store from running :meth:`setup`'s probe."""
        return self._settings.auto_setup if self._settings is not None else True

    async def setup(self) -> None:
        """Connect: build the client (off the event loop) and read one document.

        Firestore needs no schema, so setup creates nothing; the read makes it a real round
        trip (``agent-stores check`` times it), bounded by the deadline like every call.
        """
        self.check_open()

        async def probe() -> None:
            await self._connect()
            await self._read(self._ref("agent-stores-setup", "probe"))

        await within_deadline(self, probe())

    async def _aclose(self) -> None:
        client = self._client
        if not self._owns_client or client is None:
            return
        from .client import StoreClient

        if isinstance(client, StoreClient):
            await client.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> BackendUnavailableError:
        reason = redact(str(exc).splitlines()[0] if str(exc) else "") or type(exc).__name__
        return BackendUnavailableError(
            detail=f"{self.describe()}: {type(exc).__name__}: {reason[:300]}"
        )

    def _endpoint(self) -> str:
        from .client import StoreClient

        client = self._client
        if isinstance(client, StoreClient):
            return str(client._endpoint)
        if self._settings is not None and self._settings.emulator_host is not None:
            return self._settings.emulator_host
        return "the client's endpoint"

    def _nothing_there_error(
        self, exc: BaseException, attempts: int, seconds: float
    ) -> BackendUnavailableError:
        reason = redact(str(exc).splitlines()[0] if str(exc) else "") or type(exc).__name__
        hint = (
            "check emulator_host= (or FIRESTORE_EMULATOR_HOST) and that the emulator is running"
            if self._settings is not None and self._settings.emulator_host is not None
            else "check the network and the endpoint"
        )
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        return BackendUnavailableError(
            detail=f"{self.describe()}: nothing answers at {self._endpoint()} ({reason[:300]}; "
            f"{tries} in {seconds:.1f} s); {hint}"
        )

    def _outcome_unknown(
        self, what: str, scope: str, key: str, cause: BaseException | None = None
    ) -> BackendUnavailableError:
        why = f" ({type(cause).__name__})" if cause is not None else ""
        return BackendUnavailableError(
            detail=f"{self.describe()}: the reply to a {what} of {key[:80]!r} in scope "
            f"{scope[:80]!r} was lost{why} and reading back did not find the write; it may "
            "or may not have been applied (read the entry to find out)"
        )

    async def _run(
        self, call: Callable[[float], Awaitable[T]], attempt: _Attempt | None = None
    ) -> T:
        """Run ``call(timeout)`` with retries of transient failures, inside the deadline.

        Each attempt gets ``timeout`` seconds, capped by what is left of the store's
        deadline; a retry waits a jittered, exponentially growing delay and is only started
        when the deadline leaves room for it. When the retries or the deadline run out, the
        last failure is raised as :class:`BackendUnavailableError` (its cause kept).
        Conditional writes pass an ``attempt``: their conflicts pass through as answers.
        For anything else a conflict-like status (a query's missing index is
        FAILED_PRECONDITION) is a failure like any other.
        """
        from google.api_core.exceptions import GoogleAPICallError

        from .client import StoreClient

        loop = asyncio.get_running_loop()
        budget = math.inf if self.deadline_seconds is None else self.deadline_seconds
        # Keep a margin: the last attempt ends (and is handled here, its cause kept and a
        # dead channel replaced) before the core's deadline cancels the whole call.
        ends = loop.time() + budget - min(DEADLINE_MARGIN, budget / 10)
        tries = 0
        first_absent: float | None = None
        while True:
            client = self._client
            generation = client.generation if isinstance(client, StoreClient) else 0
            timeout = max(0.05, min(self._timeout, ends - loop.time()))
            try:
                result = await call(timeout)
                self._answered = True
                return result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                kind = _classify(exc)
                if _is_answer(exc):
                    self._answered = True
                if kind is None:
                    if attempt is None and isinstance(exc, GoogleAPICallError):
                        raise self._unavailable(exc) from exc
                    raise
                retryable, maybe_applied = kind
                self._recycle_if_dead(exc, client, generation, maybe_applied)
                if attempt is not None and maybe_applied:
                    _note_maybe_applied(attempt, exc, retryable)
                delay = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**tries))
                first_absent = self._give_up_if_nothing_there(exc, tries, delay, first_absent)
                if (
                    not retryable
                    or tries >= self._retries
                    or loop.time() + delay + MIN_ATTEMPT_SECONDS > ends
                ):
                    raise self._unavailable(exc) from exc
            await asyncio.sleep(delay)
            tries += 1

    def _recycle_if_dead(
        self, exc: Exception, client: AsyncClient | None, generation: int, maybe_applied: bool
    ) -> None:
        from google.api_core.exceptions import DeadlineExceeded, ServiceUnavailable

        from .client import StoreClient

        if isinstance(client, StoreClient) and (
            isinstance(exc, DeadlineExceeded)
            or (isinstance(exc, ServiceUnavailable) and not maybe_applied)
        ):
            # No answer in time (the connection may be dead without gRPC knowing),
            # or no connection: retry on a fresh channel, which connects at once
            # instead of waiting out the old one's reconnect backoff.
            client.recycle(generation, grace=self._timeout)

    def _give_up_if_nothing_there(
        self, exc: Exception, tries: int, delay: float, first_absent: float | None
    ) -> float | None:
        """When the endpoint was never reached, when that started; raises once it has
        lasted past the grace (nothing is there: retrying for the whole deadline would only
        hide a wrong ``emulator_host`` or an emulator not running)."""
        if not self._answered and _nothing_there(exc):
            now = asyncio.get_running_loop().time()
            first_absent = now if first_absent is None else first_absent
            if now + delay - first_absent > NOTHING_THERE_GRACE_SECONDS:
                raise self._nothing_there_error(exc, tries + 1, now - first_absent) from exc
        return first_absent

    def _scope_doc(self, scope: str) -> AsyncDocumentReference:
        return self._scopes_col.document(checked_id("scope", scope))

    def _entries(self, scope: str) -> AsyncCollectionReference:
        entries: AsyncCollectionReference = self._scope_doc(scope).collection(ENTRIES)
        return entries

    def _ref(self, scope: str, key: str) -> AsyncDocumentReference:
        return self._entries(scope).document(checked_id("key", key))

    def _entry(self, snap: DocumentSnapshot) -> Entry | None:
        if not snap.exists:
            return None
        data = snap.to_dict() or {}
        value = data.get(F_VALUE)
        expires = data.get(F_EXPIRES)
        if not isinstance(value, bytes) or not isinstance(expires, float | int | None):
            raise CorruptRecordError(
                detail=f"{self.describe()}: document {snap.reference.path[:200]!r} is not an "
                "agent-stores entry (value must be bytes)"
            )
        expires_at = None if expires is None else float(expires)
        nonce = data.get(F_NONCE)
        version = render_version(
            snap.update_time, nonce if isinstance(nonce, str) else "", expires_at
        )
        return Entry(value, version, expires_at)

    @staticmethod
    def _nonce(snap: DocumentSnapshot) -> str | None:
        if not snap.exists:
            return None
        nonce = (snap.to_dict() or {}).get(F_NONCE)
        return nonce if isinstance(nonce, str) else None

    @staticmethod
    def _create_data(value: bytes, expires_at: float | None, nonce: str) -> dict[str, Any]:
        data: dict[str, Any] = {F_VALUE: bytes(value), F_NONCE: nonce}
        if expires_at is not None:
            data[F_EXPIRES] = float(expires_at)
            data[F_GC] = _gc_at(expires_at)
        return data

    @staticmethod
    def _update_data(value: bytes, expires_at: float | None, nonce: str) -> dict[str, Any]:
        """Every field of an entry, so an update replaces the whole document."""
        from google.cloud.firestore import DELETE_FIELD

        data: dict[str, Any] = {F_VALUE: bytes(value), F_NONCE: nonce}
        data[F_EXPIRES] = DELETE_FIELD if expires_at is None else float(expires_at)
        data[F_GC] = DELETE_FIELD if expires_at is None else _gc_at(expires_at)
        return data

    def _at(self, update_time: Any) -> Any:
        return self.client.write_option(last_update_time=update_time)

    async def _read(self, ref: AsyncDocumentReference) -> DocumentSnapshot:
        """One document, its ``BatchGetDocuments`` stream consumed to the end.

        Not ``ref.get()``: it returns on the stream's first message and leaves the call
        running (its completion lands later, on a loop that may be closed by then).
        """
        return (await self._read_all([ref]))[0]

    # -- primitives -------------------------------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        await self._connect()
        return self._entry(await self._read(self._ref(scope, key)))

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        by_id = {checked_id("key", k): k for k in keys}
        client = await self._connect()
        entries = self._entries(scope)
        refs = [entries.document(doc_id) for doc_id in by_id]

        async def fetch(seconds: float) -> list[DocumentSnapshot]:
            return [snap async for snap in client.get_all(refs, retry=None, timeout=seconds)]

        out: dict[str, Entry] = {}
        for snap in await self._run(fetch):
            entry = self._entry(snap)
            if entry is not None and snap.id in by_id:
                out[by_id[snap.id]] = entry
        return out

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        await self._connect()
        ref = self._ref(scope, key)
        nonce = new_nonce()
        conflicts = _conflict_types()
        for _ in range(MAX_ROUNDS):
            attempt = _Attempt(resend=False)
            try:
                result = await self._run(
                    lambda timeout: ref.create(
                        self._create_data(value, expires_at, nonce),
                        retry=None,
                        timeout=timeout,
                    ),
                    attempt,
                )
                return render_version(result.update_time, nonce, expires_at)
            except conflicts:
                pass
            except _Ambiguous as lost:
                snap = await self._read(ref)
                if self._nonce(snap) == nonce:  # our own create, its reply lost
                    return render_version(snap.update_time, nonce, expires_at)
                raise self._outcome_unknown(
                    "create", scope, key, lost.__cause__
                ) from lost.__cause__
            snap = await self._read(ref)
            if self._nonce(snap) == nonce:  # our own create, its reply lost
                return render_version(snap.update_time, nonce, expires_at)
            if attempt.ambiguous:
                # Our create may have landed and been changed since: neither "exists" nor
                # creating again would be true.
                raise self._outcome_unknown("create", scope, key)
            current = self._entry(snap)
            if current is None:
                continue  # deleted in between: create again
            if not current.expired(now):
                raise ConflictError("key exists", scope=scope, key=key)
            # Replace the expired document only as it was read: a concurrent writer wins.
            pinned = self._at(snap.update_time)
            attempt = _Attempt()
            try:

                async def replace_expired(seconds: float, pinned: Any = pinned) -> Any:
                    return await ref.update(
                        self._update_data(value, expires_at, nonce),
                        option=pinned,
                        retry=None,
                        timeout=seconds,
                    )

                result = await self._run(replace_expired, attempt)
                return render_version(result.update_time, nonce, expires_at)
            except conflicts:
                if not attempt.ambiguous:
                    continue
            snap = await self._read(ref)
            if self._nonce(snap) == nonce:
                return render_version(snap.update_time, nonce, expires_at)
            raise self._outcome_unknown("create", scope, key)
        raise ConflictError("key kept changing during create", scope=scope, key=key)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        await self._connect()
        ref = self._ref(scope, key)
        parsed = parse_version(expected_version)
        if parsed is None or (parsed[1] is not None and parsed[1] <= now):
            raise ConflictError("version mismatch", scope=scope, key=key)
        nonce = new_nonce()
        attempt = _Attempt()
        try:
            result = await self._run(
                lambda timeout: ref.update(
                    self._update_data(value, expires_at, nonce),
                    option=self._at(parsed[0]),
                    retry=None,
                    timeout=timeout,
                ),
                attempt,
            )
        except _conflict_types():
            if attempt.ambiguous:
                snap = await self._read(ref)
                if self._nonce(snap) == nonce:
                    return render_version(snap.update_time, nonce, expires_at)
                # Our write may have landed and been changed since: not a known conflict.
                raise self._outcome_unknown("replace", scope, key) from None
            raise ConflictError("version mismatch", scope=scope, key=key) from None
        return render_version(result.update_time, nonce, expires_at)

    async def _delete_at(self, scope: str, key: str, ref: Any, update_time: Any) -> bool:
        """Delete ``ref`` if still at ``update_time``; True if it happened."""
        attempt = _Attempt()
        try:
            await self._run(
                lambda timeout: ref.delete(
                    option=self._at(update_time), retry=None, timeout=timeout
                ),
                attempt,
            )
        except _conflict_types():
            if attempt.ambiguous:
                raise self._outcome_unknown("delete", scope, key) from None
            return False
        return True

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        await self._connect()
        ref = self._ref(scope, key)
        if expected_version is not None:
            parsed = parse_version(expected_version)
            if parsed is None:
                return False
            if parsed[1] is not None and parsed[1] <= now:
                # Expired: counts as absent; remove it only if it is still that document.
                await self._delete_at(scope, key, ref, parsed[0])
                return False
            return await self._delete_at(scope, key, ref, parsed[0])
        for _ in range(MAX_ROUNDS):
            snap = await self._read(ref)
            current = self._entry(snap)
            if current is None:
                return False
            if current.expired(now):
                await self._delete_at(scope, key, ref, snap.update_time)
                return False
            if await self._delete_at(scope, key, ref, snap.update_time):
                return True
        raise ConflictError("key kept changing during delete", scope=scope, key=key)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        await self._connect()
        entries = self._entries(scope)
        bounds = _prefix_id_range(prefix)
        if bounds is None:
            return []  # no stored key is that long
        low, high = bounds
        # Ids sort like keys (see ids.py), so the cursor is the last id seen; the query's
        # bound is inclusive (a clipped over-long id is still a lower bound) and ids at or
        # below the cursor are skipped here.
        floor: str | None = None
        if start_after is not None and start_after >= prefix:
            floor = encode_id(start_after)
        items: list[ScanItem] = []
        while True:
            bound = low if floor is None else _clip_id(floor)
            page_size = limit - len(items) + 1  # one extra: the bound is inclusive
            page = _scan_query(entries, bound, high, values).limit(page_size)

            async def fetch(seconds: float, page: Any = page) -> list[DocumentSnapshot]:
                return [snap async for snap in page.stream(retry=None, timeout=seconds)]

            snaps = await self._run(fetch)
            for snap in snaps:
                if floor is not None and snap.id <= floor:
                    continue
                item = self._scan_item(snap, prefix, values, now)
                if item is None:
                    continue
                items.append(item)
                if len(items) >= limit:
                    return items
            if len(snaps) < page_size or (floor is not None and snaps[-1].id <= floor):
                return items
            floor = snaps[-1].id

    def _scan_item(
        self, snap: DocumentSnapshot, prefix: str, values: bool, now: float
    ) -> ScanItem | None:
        """The scan's item for one document, or None when it is not a live key of ``prefix``."""
        try:
            key = decode_id(snap.id)
        except ValueError:
            return None  # not ours (written by someone else into this collection)
        if not key.startswith(prefix):
            return None
        if values:
            entry = self._entry(snap)
            if entry is None or entry.expired(now):
                return None
            return ScanItem(key, entry)
        # A keys-only scan reads just the expiry, so the entry is not built (or checked).
        expires = (snap.to_dict() or {}).get(F_EXPIRES)
        if isinstance(expires, float | int) and expires <= now:
            return None
        return ScanItem(key, None)

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        # A skip scan over the ``entries`` collection group, in document-name order: one
        # 1-document query finds the first entry of the next scope, then the bound jumps
        # past that scope. Cost: about one query per scope returned, however many scopes
        # the namespace holds (ListDocuments can only start at the beginning).
        from google.cloud.firestore_v1.base_query import FieldFilter

        client = await self._connect()
        group = client.collection_group(ENTRIES)
        base = self._scopes_path
        if start_after is not None and start_after >= prefix:
            bound = _past_scope(base, encode_id(start_after))
        else:
            low = encode_id(prefix)
            if len(low.encode("utf-8")) > MAX_ID_BYTES:
                return []  # no scope id is that long
            bound = f"{base}{low}/{ENTRIES}/{MARKER}"
        found: list[str] = []
        while len(found) < limit:
            query = (
                group.where(filter=FieldFilter("__name__", ">=", client.document(bound)))
                .order_by("__name__")
                .select([F_EXPIRES])
                .limit(1)
            )

            async def fetch(seconds: float, query: Any = query) -> list[DocumentSnapshot]:
                return [snap async for snap in query.stream(retry=None, timeout=seconds)]

            snaps = await self._run(fetch)
            if not snaps or not snaps[0].reference.path.startswith(base):
                return found  # past the namespace
            doc_id = snaps[0].reference.parent.parent.id
            bound = _past_scope(base, doc_id)
            try:
                scope = decode_id(doc_id)
            except ValueError:
                continue  # not ours
            if not scope.startswith(prefix):
                return found  # past the prefix: ids keep the order of scopes
            expires = (snaps[0].to_dict() or {}).get(F_EXPIRES)
            live = not (isinstance(expires, float | int) and expires <= now)
            # Its first entry has expired: the scope may still hold live ones.
            if live or await self._scan(scope, "", None, 1, False, now):
                found.append(scope)
        return found

    async def _drop_scope(self, scope: str) -> int:
        client = await self._connect()
        entries = self._entries(scope)
        total = 0
        while True:
            page = entries.order_by("__name__").select([F_EXPIRES]).limit(DROP_PAGE)

            async def fetch(seconds: float, page: Any = page) -> list[DocumentSnapshot]:
                return [snap async for snap in page.stream(retry=None, timeout=seconds)]

            snaps = await self._run(fetch)
            if not snaps:
                return total
            refs = [snap.reference for snap in snaps]

            async def delete_page(
                seconds: float, refs: list[AsyncDocumentReference] = refs
            ) -> None:
                # A fresh batch per attempt: a committed batch forgets its writes.
                batch = client.batch()
                for ref in refs:
                    batch.delete(ref)
                await batch.commit(retry=None, timeout=seconds)

            # Unconditional deletes: repeating them after a lost reply is harmless.
            await self._run(delete_page)
            total += len(snaps)

    # -- commit -----------------------------------------------------------------------------

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        return await self._commit_across([scope] * len(ops), ops, now)

    async def transact(
        self,
        ops: Sequence[tuple[str, Operation]],
        *,
        ensure: Sequence[tuple[str, str, bytes]] = (),
    ) -> list[str | None]:
        """``commit`` across scopes: ``(scope, operation)`` pairs all-or-nothing in one
        ``Commit``, plus ``ensure``: ``(scope, key, value)`` documents created when absent
        and left as they are when present (directory markers), which never fail it.

        For this package's native ports (the memory port's record, receipt and markers):
        the caller has checked ids and values (``check_file_write``). Returns each
        operation's new version (None for Delete and Check); a failed condition raises
        :class:`~agent_stores.errors.ConflictError` (``index`` into ``ops``). One request
        when every expected version holds and no ``ensure`` document exists yet; else
        the documents are read and the commit decided on them (three).
        """
        self.check_open()
        scopes = [scope for scope, _ in ops] + [scope for scope, _, _ in ensure]
        plain = [op for _, op in ops]
        marks: list[Operation] = [_Ensure(key, value) for _, key, value in ensure]
        versions = await within_deadline(
            self, self._commit_across(scopes, plain + marks, self.clock())
        )
        return versions[: len(plain)]

    async def commit_as_expected(self, scope: str, ops: Sequence[Operation]) -> list[str | None]:
        """:meth:`commit` in one ``Commit`` whose preconditions come from the operations
        alone, and nothing more: when one fails it raises
        :class:`~agent_stores.errors.ConflictError` at once (``index`` None), nothing read
        and nothing written, where :meth:`commit` reads the documents and decides on them
        (a document that expired but is still stored counts as absent there, and fails
        here). For native ports with a fallback of their own: the session port's warm
        acquire, which the core's generic path follows when it fails.

        A reply lost in flight is settled as :meth:`commit` settles it (the write's nonce
        read back): a commit that landed is never reported as a conflict."""
        self.check_commit(scope, ops)
        if not ops:
            return []
        commit = self._commit_across(
            [scope] * len(ops), list(ops), self.clock(), decide_on_stored=False
        )
        return await within_deadline(self, commit)

    async def delete_expired(self, scope: str, key: str) -> bool:
        """Delete the document of ``key`` if it is stored but expired (and still as read);
        True if one was deleted. A live document is left alone. For preconditions of
        :meth:`commit_as_expected` that require a document's absence: they cannot tell
        an expired document from a live one, and Firestore removes expired documents
        only through a TTL policy the deployment may not have."""
        self.check_open()
        self.check_ids(scope, key)
        return await within_deadline(self, self._delete_expired(scope, key))

    async def _delete_expired(self, scope: str, key: str) -> bool:
        await self._connect()
        ref = self._ref(scope, key)
        snap = await self._read(ref)
        current = self._entry(snap)
        if current is None or not current.expired(self.clock()):
            return False
        return await self._delete_at(scope, key, ref, snap.update_time)

    async def _commit_across(
        self,
        scopes: list[str],
        ops: list[Operation],
        now: float,
        *,
        decide_on_stored: bool = True,
    ) -> list[str | None]:
        """Commit ``ops[i]`` on ``scopes[i]`` all-or-nothing (``_Ensure`` ones last, with no
        version in the result when left as they were); ``decide_on_stored`` False: a failed
        precondition raises ConflictError instead of reading the documents and trying again
        (:meth:`commit_as_expected`)."""
        if len(ops) > MAX_BATCH_WRITES:
            raise UnsupportedError(
                detail=f"firestore commits at most {MAX_BATCH_WRITES} operations at once"
            )
        size = sum(len(op.value) for op in ops if isinstance(op, Create | Replace))
        if size > MAX_COMMIT_BYTES:
            raise ValueTooLargeError(
                f"commit of {len(ops)} operations carries {size} bytes; a Firestore commit "
                f"holds at most {MAX_COMMIT_BYTES} bytes of values",
                size=size,
                limit=MAX_COMMIT_BYTES,
            )
        await self._connect()
        refs = [self._ref(scope, op.key) for scope, op in zip(scopes, ops, strict=True)]
        nonces = [new_nonce() for _ in ops]
        conflicts = _conflict_types()
        # First try: preconditions straight from the operations (one round trip). When it
        # fails, read the documents, decide each operation on what is stored (expired
        # documents count as absent) and pin every one to that state.
        state: list[DocumentSnapshot] | None = None
        for _ in range(MAX_ROUNDS):
            # Built before the first attempt: a failed condition raises here, unsent.
            try:
                _, expiries = self._build_batch(scopes, ops, refs, nonces, now, state)
            except _DecideOnStoredState:
                if not decide_on_stored:
                    raise ConflictError("version mismatch", scope=scopes[0]) from None
                state = await self._read_all(refs)
                continue
            # A batch that creates a document is never re-sent blindly (see _Attempt).
            attempt = _Attempt(resend=not any(isinstance(op, Create) for op in ops))

            async def send(
                seconds: float, state: list[DocumentSnapshot] | None = state
            ) -> list[Any]:
                # A fresh batch per attempt: a committed batch forgets its writes, so a
                # re-sent one would be empty.
                batch, _ = self._build_batch(scopes, ops, refs, nonces, now, state)
                results: list[Any] = await batch.commit(retry=None, timeout=seconds)
                return results

            try:
                results = await self._run(send, attempt)
            except _Ambiguous as lost:
                applied = await self._applied(scopes, ops, refs, nonces, expiries)
                if applied is not None:
                    return applied
                raise self._outcome_unknown(
                    "commit", scopes[0], ops[0].key, lost.__cause__
                ) from lost.__cause__
            except conflicts:
                if attempt.ambiguous:
                    applied = await self._applied(scopes, ops, refs, nonces, expiries)
                    if applied is not None:
                        return applied
                    # It may have landed and been changed since: sending it again could
                    # apply it twice, and a conflict may be our own write's.
                    raise self._outcome_unknown("commit", scopes[0], ops[0].key) from None
                if not decide_on_stored:
                    raise ConflictError("a precondition failed", scope=scopes[0]) from None
                state = await self._read_all(refs)
                continue
            # Skipped ``_Ensure`` documents come last: the results are the ops' first
            # (``transact`` keeps only those of its operations).
            return [
                render_version(result.update_time, nonces[i], expiries[i])
                if isinstance(ops[i], Create | Replace)
                else None
                for i, result in enumerate(results)
            ]
        raise ConflictError("keys kept changing during commit", scope=scopes[0])

    async def _read_all(self, refs: list[AsyncDocumentReference]) -> list[DocumentSnapshot]:
        client = self.client

        async def fetch(seconds: float) -> list[DocumentSnapshot]:
            return [snap async for snap in client.get_all(refs, retry=None, timeout=seconds)]

        by_path = {snap.reference.path: snap for snap in await self._run(fetch)}
        return [by_path[ref.path] for ref in refs]

    async def _applied(
        self,
        scopes: list[str],
        ops: list[Operation],
        refs: list[AsyncDocumentReference],
        nonces: list[str],
        expiries: list[float | None],
    ) -> list[str | None] | None:
        """Versions if a commit whose reply was lost was applied (its nonce is stored)."""
        # An ``_Ensure`` document found present is left with another write's nonce.
        writes = [
            i
            for i, op in enumerate(ops)
            if isinstance(op, Create | Replace) and not isinstance(op, _Ensure)
        ]
        if not writes:
            raise self._outcome_unknown("commit", scopes[0], ops[0].key)
        snaps = await self._read_all([refs[i] for i in writes])
        if all(self._nonce(snap) == nonces[i] for i, snap in zip(writes, snaps, strict=True)):
            out: list[str | None] = [None] * len(ops)
            for i, snap in zip(writes, snaps, strict=True):
                out[i] = render_version(snap.update_time, nonces[i], expiries[i])
            return out
        return None

    def _build_batch(
        self,
        scopes: list[str],
        ops: list[Operation],
        refs: list[AsyncDocumentReference],
        nonces: list[str],
        now: float,
        state: list[DocumentSnapshot] | None,
    ) -> tuple[AsyncWriteBatch, list[float | None]]:
        batch = self.client.batch()
        expiries: list[float | None] = []
        absent = self.client.write_option(exists=False)
        for i, (op, ref) in enumerate(zip(ops, refs, strict=True)):
            expires_at = self.expires_at(op.ttl, now) if isinstance(op, Create | Replace) else None
            expiries.append(expires_at)
            if state is None:
                option = self._pin_to_expected(scopes[i], ops, i, now)
                exists = option is not None
            else:
                option, exists = self._pin_to_stored(scopes[i], op, i, state[i], now, absent)
            self._add_write(batch, op, ref, nonces[i], expires_at, option, exists, absent)
        return batch, expiries

    def _pin_to_expected(self, scope: str, ops: list[Operation], index: int, now: float) -> Any:
        """The precondition of ``ops[index]`` from its expected version alone (nothing read):
        the document's update time, or None when the operation expects no version."""
        op = ops[index]
        expected = op.expected_version if not isinstance(op, Create) else None
        if expected is None:
            return None
        parsed = parse_version(expected)
        if parsed is None or (parsed[1] is not None and parsed[1] <= now):
            if any(_may_fail(earlier) for earlier in ops[:index]):
                # The first failing operation is the one to report, and an
                # earlier one may fail on what is stored: read it first.
                raise _DecideOnStoredState
            raise _operation_failed(scope, op, index, "version mismatch")
        return self._at(parsed[0])

    def _pin_to_stored(
        self, scope: str, op: Operation, index: int, snap: DocumentSnapshot, now: float, absent: Any
    ) -> tuple[Any, bool]:
        """``(precondition, document exists)`` deciding ``op`` on the stored ``snap``: the
        write is pinned to that exact state (expired documents count as absent)."""
        current = self._entry(snap)
        live = current if current is not None and not current.expired(now) else None
        stored = self._at(snap.update_time) if current is not None else absent
        if isinstance(op, _Ensure) and live is not None:
            return _LEAVE_AS_IS, True
        if isinstance(op, Create):
            if live is not None:
                raise _operation_failed(scope, op, index, "key exists")
            return stored, current is not None
        expected = op.expected_version
        if expected is not None and (live is None or live.version != expected):
            raise _operation_failed(scope, op, index, "version mismatch")
        if expected is None and isinstance(op, Check) and live is not None:
            raise _operation_failed(scope, op, index, "key exists")
        return stored, current is not None

    def _add_write(
        self,
        batch: AsyncWriteBatch,
        op: Operation,
        ref: AsyncDocumentReference,
        nonce: str,
        expires_at: float | None,
        option: Any,
        exists: bool,
        absent: Any,
    ) -> None:
        """Add ``op``'s write under precondition ``option``; ``exists``: whether that
        precondition is on an existing document."""
        from google.cloud.firestore import DELETE_FIELD

        if option is _LEAVE_AS_IS:
            return
        if isinstance(op, Create) and not exists:
            batch.create(ref, self._create_data(op.value, expires_at, nonce))
        elif isinstance(op, Create | Replace):
            # A create over an expired document replaces it, pinned to that document.
            batch.update(ref, self._update_data(op.value, expires_at, nonce), option=option)
        elif isinstance(op, Delete):
            batch.delete(ref, option=option)
        elif exists:
            # A Check writes nothing: clearing a field that never exists still carries
            # the precondition, and changes nothing.
            batch.update(ref, {F_CHECK: DELETE_FIELD}, option=option)
        else:
            # A Check of an absent key: deleting a missing document is a no-op that
            # still fails if the document appeared.
            batch.delete(ref, option=absent)

    # -- for native ports (the vector port of this package) ------------------------------------

    #: The fields :meth:`entry_version` needs: a projection (``select``/``field_paths``) of
    #: these reads an entry's version without its value.
    VERSION_FIELDS: ClassVar[tuple[str, ...]] = (F_NONCE, F_EXPIRES)

    async def connect(self) -> AsyncClient:
        """The client, built on first use (as every primitive does); raises
        :class:`~agent_stores.errors.ResourceClosedError` once the store is closed."""
        self.check_open()
        return await self._connect()

    @property
    def namespace(self) -> AsyncDocumentReference:
        """The namespace document ``COLLECTION/{prefix id}``, parent of ``scopes``: a native
        port keeps its own collections beside it, so stores of different prefixes never
        share them. Needs the client (after :meth:`connect`)."""
        namespace: AsyncDocumentReference = self.client.collection(self.collection).document(
            encode_id(self.prefix)
        )
        return namespace

    def entries_of(self, scope: str) -> AsyncCollectionReference:
        """The collection of ``scope``'s entries: one document per key, its id
        :func:`~agent_stores_firestore.ids.encode_id` of the key (ids sort like keys).
        Raises :class:`~agent_stores.errors.InvalidIdError` for a scope too long for an id."""
        return self._entries(scope)

    @staticmethod
    def entry_version(snap: DocumentSnapshot) -> tuple[str, float | None] | None:
        """``(version, expires_at)`` of the entry ``snap`` (read with at least
        :attr:`VERSION_FIELDS`), exactly as a ``get`` reports them; None when there is no
        document."""
        if not snap.exists:
            return None
        data = snap.to_dict() or {}
        expires = data.get(F_EXPIRES)
        expires_at = float(expires) if isinstance(expires, float | int) else None
        nonce = data.get(F_NONCE)
        version = render_version(
            snap.update_time, nonce if isinstance(nonce, str) else "", expires_at
        )
        return version, expires_at

    async def request(self, call: Callable[[float], Awaitable[T]]) -> T:
        """Run ``call(timeout)`` — a read, or a write whose repetition is harmless — with
        the store's retries of transient failures, each attempt's timeout capped by the
        deadline. A failure (after the retries, or one that is not transient) is raised
        as :class:`~agent_stores.errors.BackendUnavailableError`, its cause kept. Bound
        the whole operation with :func:`~agent_stores.backend.within_deadline`."""
        return await self._run(call)

    # -- admin --------------------------------------------------------------------------------

    async def iter_documents(self, scope: str) -> AsyncIterator[str]:
        """Raw document ids of a scope (for diagnostics and tests)."""
        await self._connect()
        async for ref in self._entries(scope).list_documents(retry=None, timeout=self._timeout):
            yield ref.id


class _Ensure(Create):
    """A document of :meth:`FirestoreKV.transact`'s ``ensure``: created when absent, left
    as it is when present. Tried as a create; when it fails, decided on what is stored."""


#: The precondition of an ``_Ensure`` document found present: no write at all.
_LEAVE_AS_IS = object()


class _DecideOnStoredState(Exception):
    """A commit's outcome depends on what is stored: read the documents before deciding."""


def _operation_failed(scope: str, op: Operation, index: int, why: str) -> ConflictError:
    return ConflictError(
        f"operation {index} ({type(op).__name__}) failed: {why}",
        scope=scope,
        key=op.key,
        index=index,
    )


def _may_fail(op: Operation) -> bool:
    """Whether ``op`` can fail on what is stored (only an unconditional delete cannot)."""
    return not (isinstance(op, Delete) and op.expected_version is None)


def _past_scope(base: str, doc_id: str) -> str:
    """A document path sorting after every entry of scope ``doc_id`` and before the next scope.

    Paths compare segment by segment. ``doc_id + "\\x01"`` is below every longer id that
    starts with ``doc_id`` (ids never hold NUL) and above ``doc_id``; at the id length
    limit no longer id exists, and a collection name after ``entries`` does the same.
    """
    nxt = doc_id + "\x01"
    if len(nxt.encode("utf-8")) <= MAX_ID_BYTES:
        return f"{base}{nxt}/{ENTRIES}/{MARKER}"
    return f"{base}{doc_id}/{ENTRIES}\x01/{MARKER}"


def _prefix_id_range(prefix: str) -> tuple[str, str | None] | None:
    """``(low, high)`` document ids bounding the keys that start with ``prefix`` (``high``
    exclusive, None for no upper bound), or None when no stored id can start with it."""
    low = encode_id(prefix)
    if len(low.encode("utf-8")) > MAX_ID_BYTES:
        return None
    upper = prefix_upper_bound(prefix)
    high = None if upper is None else encode_id(upper)
    if high is not None and len(high.encode("utf-8")) > MAX_ID_BYTES:
        high = None  # every stored id is below it; the scan's prefix check filters
    return low, high


def _scan_query(
    entries: AsyncCollectionReference, bound: str, high: str | None, values: bool
) -> Any:
    """A scope's entries from id ``bound`` (inclusive) up to ``high``, in id order; a
    keys-only scan fetches only the expiry."""
    from google.cloud.firestore_v1.base_query import FieldFilter

    query = entries.order_by("__name__").where(
        filter=FieldFilter("__name__", ">=", entries.document(bound))
    )
    if high is not None:
        query = query.where(filter=FieldFilter("__name__", "<", entries.document(high)))
    if not values:
        query = query.select([F_EXPIRES])
    return query


def _clip_id(doc_id: str) -> str:
    """``doc_id`` cut to Firestore's id limit at a character boundary (a lower bound still)."""
    raw = doc_id.encode("utf-8")
    if len(raw) <= MAX_ID_BYTES:
        return doc_id
    return raw[:MAX_ID_BYTES].decode("utf-8", "ignore")


def _pop_clock(options: dict[str, Any]) -> Clock | None:
    clock: Any = options.pop("clock", None)
    if options:
        raise ConfigError(detail=f"unknown option(s) for the firestore backend: {sorted(options)}")
    if clock is not None and not callable(clock):
        raise ConfigError(detail="clock must be a callable returning unix seconds")
    return cast("Clock | None", clock)


__all__ = ["FirestoreKV", "parse_version", "render_version"]

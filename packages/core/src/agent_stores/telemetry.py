"""OpenTelemetry spans and metrics for store operations (the ``otel`` extra).

Emitted through OpenTelemetry's *global* tracer and meter providers, as instrumented
libraries do: nothing is exported until the application configures a provider (the
OpenTelemetry SDK, Logfire, …). Without ``opentelemetry-api`` installed every helper
here is the identity; with it but without a configured tracer provider a traced call
costs one provider lookup and creates no span.

Spans (``agent_stores.<store>.<operation>``, kind CLIENT) carry the database semantic
conventions: ``db.system`` / ``db.system.name``, ``db.operation.name``, and, for networked
backends, ``server.address`` / ``server.port`` taken from the store's redacted
description (never a password or a query string), and ``agent_stores.round_trips`` /
``agent_stores.bytes``: the KV calls the operation made through the KV API and the value
bytes they moved (a backend's native fast path is not counted). On failure they get status ERROR and
``error.type`` = the agent-stores error code (or the exception's class name). No id,
path, message or value is ever put in an attribute.

Metrics (meter ``agent_stores``): ``agent_stores.operation.duration`` (s, per operation),
``agent_stores.session.turn.duration`` (s, acquire to release), ``agent_stores.session.lease.wait``
(s, time to obtain the lease), ``agent_stores.session.handovers``,
``agent_stores.conflicts`` and ``agent_stores.retries`` (counters).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar


def _installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry") is not None
    except (ImportError, ValueError):  # e.g. blocked with sys.modules["opentelemetry"] = None
        return False


# The API is imported on first use, not here: the KV layer imports this module, and a
# command such as ``agent-stores --help`` must not pay for OpenTelemetry.
_AVAILABLE: bool = _installed()
_trace: Any = None
_metrics: Any = None


def _api() -> bool:
    """Import the OpenTelemetry API once; False when it is not installed or not in use yet."""
    global _trace, _metrics
    if _trace is None:
        if not _AVAILABLE or not _in_use():
            return False
        from opentelemetry import metrics, trace

        _trace, _metrics = trace, metrics
    return True


# The API modules through which an application configures a provider, and the variables
# naming one that the API loads on its first provider lookup.
_API_MODULES = ("opentelemetry.trace", "opentelemetry.metrics")
_PROVIDER_VARIABLES = ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")


def _in_use() -> bool:
    """True once a provider may be configured: the API imported, or one named in the environment.

    Until then every span and instrument would be a no-op proxy, so the import (tens of
    milliseconds, about a quarter of a CLI listing) waits until the application uses it.
    """
    return any(name in sys.modules for name in _API_MODULES) or _provider_named()


_named: bool | None = None


def _provider_named() -> bool:
    """True when the environment names a provider for the API to load (read once: every
    store call asks, and ``os.environ`` costs a microsecond a lookup; a provider is named
    before the process starts, not while it runs)."""
    global _named
    if _named is None:
        _named = any(name in os.environ for name in _PROVIDER_VARIABLES)
    return _named


#: ``opentelemetry.trace`` keeps the provider set by ``set_tracer_provider`` here (None
#: until then); reading it skips the API's own environment lookup on every call. A test
#: guards the name; without it the public lookup is used.
_PROVIDER_ATTRIBUTE = "_TRACER_PROVIDER"
#: and ``opentelemetry.metrics`` the one set by ``set_meter_provider`` here
_METER_MODULE, _METER_ATTRIBUTE = "opentelemetry.metrics._internal", "_METER_PROVIDER"
_MISSING = object()


P = ParamSpec("P")
T = TypeVar("T")

SCOPE = "agent_stores"
#: ``db.system`` values for the backend names agent-stores knows (others pass through).
_DB_SYSTEMS = {
    "postgres": "postgresql",
    "postgresql": "postgresql",
    "redis": "redis",
    "redis-cluster": "redis",
    "sqlite": "sqlite",
    "dynamodb": "aws.dynamodb",
    "cosmos": "azure.cosmosdb",
    "firestore": "gcp.firestore",
}
_CONFLICT_CODES = frozenset({"KV_CONFLICT", "SESSION_BUSY", "RUN_EXISTS"})
_CONFLICT_CLASSES = frozenset({"MemoryConflictError", "MemoryOperationConflictError"})

_attributes_cache: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def enabled() -> bool:
    """True when the API is installed and the application configured a tracer provider."""
    trace = _trace
    if trace is not None and _named is False and getattr(trace, _PROVIDER_ATTRIBUTE, 0) is None:
        return False  # the usual answer, in one look: API loaded, no provider set or named
    if _trace is None and not _api():
        return False
    if getattr(_trace, _PROVIDER_ATTRIBUTE, _MISSING) is None and not _provider_named():
        return False  # none set, none to load: the API would hand out its proxy
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


# The API's stand-ins until an application sets a meter provider (the proxy's class is
# not exported, hence by name).
_PLACEHOLDER_METER_PROVIDERS = frozenset({"_ProxyMeterProvider", "NoOpMeterProvider"})


def recording() -> bool:
    """True when the application configured a tracer or a meter provider.

    Without either every span and instrument is a no-op, so the per-turn wrappers skip
    even the bookkeeping (timestamps, attributes) and a turn costs what it would without
    OpenTelemetry installed.
    """
    if enabled():
        return True
    if _trace is None:
        return False
    internal = sys.modules.get(_METER_MODULE)
    if getattr(internal, _METER_ATTRIBUTE, _MISSING) is None and not _provider_named():
        return False  # as in enabled(): none set, none to load
    return type(_metrics.get_meter_provider()).__name__ not in _PLACEHOLDER_METER_PROVIDERS


def backend_attributes(kv: Any) -> dict[str, Any]:
    """Semantic-convention attributes of a KV store (cached per store object)."""
    if kv is None:
        return {}
    try:
        return _attributes_cache[kv]
    except (KeyError, TypeError):
        pass
    name = str(getattr(kv, "backend_name", "") or "unknown")
    system = _DB_SYSTEMS.get(name, name)
    attrs: dict[str, Any] = {"db.system": system, "db.system.name": system}
    described = _safe_describe(kv)
    if "://" in described:
        from .url import StoreURL

        try:
            parsed = StoreURL.parse(described.split()[0])
        except ValueError:
            parsed = None
        if parsed is not None and parsed.host:
            attrs["server.address"] = parsed.host
            if parsed.port is not None:
                attrs["server.port"] = parsed.port
    try:
        _attributes_cache[kv] = attrs
    except TypeError:
        pass
    return attrs


def _safe_describe(kv: Any) -> str:
    try:
        return str(kv.describe())
    except Exception:
        return ""


def error_type(exc: BaseException) -> str:
    """``error.type``: the agent-stores error code, else the exception's class name."""
    code = getattr(exc, "code", None)
    value = getattr(code, "value", code)
    return str(value) if isinstance(value, str) and value else type(exc).__name__


class _Counter:
    """KV round trips and bytes of the operation whose span is current."""

    __slots__ = ("bytes", "round_trips")

    def __init__(self) -> None:
        self.round_trips = 0
        self.bytes = 0


_counter: ContextVar[_Counter | None] = ContextVar("agent_stores_kv_counter", default=None)


def kv_call(
    fn: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Decorate a public KV method: counts a round trip and its value bytes into the
    current operation's span (``agent_stores.round_trips`` / ``agent_stores.bytes``).

    Outside a span it hands the call straight through (no extra coroutine frame).
    Backends' native fast paths that bypass the KV API are not counted.
    """
    if not _AVAILABLE:
        return fn

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        counter = _counter.get()
        if counter is None:
            return fn(*args, **kwargs)
        return _counted(counter, fn(*args, **kwargs), _sent_bytes(args, kwargs))

    return wrapper


async def _counted(counter: _Counter, call: Coroutine[Any, Any, T], sent: int) -> T:
    result = await call
    counter.round_trips += 1
    counter.bytes += sent + _received_bytes(result)
    return result


def _sent_bytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    total = 0
    for value in (*args, *kwargs.values()):
        if isinstance(value, bytes):
            total += len(value)
        elif isinstance(value, list | tuple):
            total += sum(
                len(v) for op in value if isinstance(v := getattr(op, "value", None), bytes)
            )
    return total


def _received_bytes(result: Any) -> int:
    value = getattr(result, "value", None)
    if isinstance(value, bytes):
        return len(value)
    items = (
        result.values() if isinstance(result, dict) else result if isinstance(result, list) else ()
    )
    total = 0
    for item in items:
        entry = getattr(item, "entry", item)
        value = getattr(entry, "value", None)
        if isinstance(value, bytes):
            total += len(value)
    return total


@contextmanager
def span(operation: str, kv: Any = None, **attributes: Any) -> Iterator[Any]:
    """A CLIENT span ``agent_stores.<operation>`` with the store's attributes (None when off).

    Records ``agent_stores.operation.duration`` and counts conflicts. ``attributes`` must
    be counts or names chosen by agent-stores, never caller data.
    """
    if not enabled():
        yield None
        return
    tracer = _trace.get_tracer(SCOPE)
    attrs = {**backend_attributes(kv), "db.operation.name": operation, **attributes}
    started = time.perf_counter()
    outcome = "ok"
    outer = _counter.get()
    counter = _Counter()
    token = _counter.set(counter)
    with tracer.start_as_current_span(
        f"agent_stores.{operation}",
        kind=_trace.SpanKind.CLIENT,
        attributes=attrs,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            kind = error_type(exc)
            outcome = kind
            if not _is_cancellation(exc):
                current.set_attribute("error.type", kind)
                current.set_status(_trace.Status(_trace.StatusCode.ERROR, kind))
                if kind in _CONFLICT_CODES or type(exc).__name__ in _CONFLICT_CLASSES:
                    _instruments().conflicts.add(1, {"db.operation.name": operation})
            raise
        finally:
            _counter.reset(token)
            if counter.round_trips:
                current.set_attribute("agent_stores.round_trips", counter.round_trips)
                current.set_attribute("agent_stores.bytes", counter.bytes)
            if outer is not None:  # an enclosing operation includes this one's traffic
                outer.round_trips += counter.round_trips
                outer.bytes += counter.bytes
            _instruments().duration.record(
                time.perf_counter() - started,
                {
                    "db.operation.name": operation,
                    "db.system.name": attrs.get("db.system.name", "unknown"),
                    "outcome": outcome,
                },
            )


def traced(
    operation: str, kv: Callable[[Any], Any] = lambda self: getattr(self, "kv", None)
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Decorate an async store method: one span per call (identity without the extra).

    ``kv`` finds the KV store from ``self`` for the backend attributes.
    """

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        if not _AVAILABLE:
            return fn

        async def spanned(args: Any, kwargs: Any) -> T:
            with span(operation, _find_kv(kv, args)):
                return await fn(*args, **kwargs)

        # Not a coroutine function itself: without a provider the caller awaits ``fn``'s
        # own coroutine, with no extra frame in between.
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
            if not enabled():
                return fn(*args, **kwargs)
            return spanned(args, kwargs)

        return wrapper

    return decorate


def _find_kv(kv: Callable[[Any], Any], args: tuple[Any, ...]) -> Any:
    try:
        return kv(args[0]) if args else None
    except Exception:
        return None


def _is_cancellation(exc: BaseException) -> bool:
    import asyncio

    return isinstance(exc, asyncio.CancelledError | GeneratorExit)


# -- metrics ----------------------------------------------------------------------------


class _Instruments:
    def __init__(self) -> None:
        meter = _metrics.get_meter(SCOPE)
        self.duration = meter.create_histogram(
            "agent_stores.operation.duration", unit="s", description="Store operation latency."
        )
        self.turn = meter.create_histogram(
            "agent_stores.session.turn.duration",
            unit="s",
            description="Session turn latency, from acquiring the lease to releasing it.",
        )
        self.lease_wait = meter.create_histogram(
            "agent_stores.session.lease.wait",
            unit="s",
            description="Time a turn waited to obtain the session's lease.",
        )
        self.handovers = meter.create_counter(
            "agent_stores.session.handovers",
            description="Sessions passed from one client to a waiting one.",
        )
        self.conflicts = meter.create_counter(
            "agent_stores.conflicts", description="Operations that lost a conditional write."
        )
        self.retries = meter.create_counter(
            "agent_stores.retries", description="Backend calls retried after a transient error."
        )


@functools.cache
def _instruments() -> _Instruments:
    # Instruments from the global meter are proxies until a provider is set, then live.
    return _Instruments()


def record_lease_wait(seconds: float, kv: Any = None) -> None:
    """Time a turn spent obtaining its lease."""
    if _api():
        _instruments().lease_wait.record(seconds, _system(kv))


def record_turn(seconds: float, kv: Any = None, *, outcome: str = "ok") -> None:
    """A finished turn's duration (acquire to release)."""
    if _api():
        _instruments().turn.record(seconds, {**_system(kv), "outcome": outcome})


def record_handover(kv: Any = None) -> None:
    """A session taken over from a client that released it for a waiting one."""
    if _api():
        _instruments().handovers.add(1, _system(kv))


def record_retry(operation: str, kv: Any = None) -> None:
    """A backend call retried after a transient error."""
    if _api():
        _instruments().retries.add(1, {**_system(kv), "db.operation.name": operation})


def _system(kv: Any) -> dict[str, Any]:
    attrs = backend_attributes(kv)
    return {"db.system.name": attrs.get("db.system.name", "unknown")}


# -- session turns ----------------------------------------------------------------------

# turn object -> when its acquisition started (perf_counter)
_turn_started: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def turn_enter(fn: Callable[[Any], Awaitable[T]]) -> Callable[[Any], Awaitable[T]]:
    """Decorate a turn's ``__aenter__``: a ``session.acquire`` span and the lease wait."""
    if not _AVAILABLE:
        return fn

    async def traced(turn: Any) -> T:
        kv = _find_kv(lambda t: t.store.kv, (turn,))
        started = time.perf_counter()
        with span("session.acquire", kv):
            result = await fn(turn)
        record_lease_wait(time.perf_counter() - started, kv)
        _turn_started[turn] = started
        return result

    # Not a coroutine function: untraced, it hands back ``fn``'s own coroutine, so a turn
    # costs no coroutine of its own (nor a level every resume passes through).
    @functools.wraps(fn)
    def wrapper(turn: Any) -> Awaitable[T]:
        return traced(turn) if recording() else fn(turn)

    return wrapper


def turn_exit(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Decorate a turn's ``__aexit__``: a ``session.release`` span and the turn duration."""
    if not _AVAILABLE:
        return fn

    async def traced(turn: Any, *args: Any) -> T:
        kv = _find_kv(lambda t: t.store.kv, (turn,))
        outcome = "ok" if not args or args[0] is None else "error"
        try:
            with span("session.release", kv):
                return await fn(turn, *args)
        finally:
            started = _turn_started.pop(turn, None)
            if started is not None:
                record_turn(time.perf_counter() - started, kv, outcome=outcome)

    @functools.wraps(fn)
    def wrapper(turn: Any, *args: Any) -> Awaitable[T]:
        # Its acquire was not recorded: nor is its release (``fn``'s coroutine as it is).
        return traced(turn, *args) if turn in _turn_started else fn(turn, *args)

    return wrapper

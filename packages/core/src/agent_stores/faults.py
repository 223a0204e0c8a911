"""Fault injection for the contract's fault mode: the routine faults of a real service.

Emulators never throttle, never report a transaction conflict, never lose a reply and
never go silent; the real services do all of these. A backend proves it survives its own
service's faults by handing the contract suite a :class:`FaultInjector` through the
``fault_injector`` hook. The injector sits at the SDK's transport (a botocore event
hook, an azure-core pipeline policy, a gRPC interceptor, a wrapped connection), so the
real server answers every call that is not faulted: nothing of the store is mocked.

Each fault an injector offers has a name of its own (the vendor's: ``ThrottlingException``,
``449``, ``ABORTED``) and one standard :class:`FaultKind`, which tells the suite what a
correct store does with it:

* ``transient`` / ``conflict`` / ``reset`` — retried within a bounded budget; if the
  budget runs out, a :class:`~agent_stores.errors.BackendUnavailableError` (never a
  configuration error), with the cause kept;
* ``lost_reply`` — the request *was applied* and the reply never arrives: the store must
  find out what happened (read back, recognise its own write), never guess;
* ``stale_read`` — a read served at an older version, as a lagging replica would;
* ``blackhole`` — the peer accepts the connection and never answers: a typed error
  within the call's deadline, never a hang.

:class:`BaseFaultInjector` keeps the bookkeeping (armed faults, a random rate, counts),
so a backend's injector only decides, per request, ``fault = self.next_fault(operation)``
and carries the fault out at its transport. Because the injector sees every request the
SDK sends, it also counts them (:meth:`BaseFaultInjector.count_request`,
:meth:`~BaseFaultInjector.requests`): at rate 0 it is the request meter of
``benchmarks/request_counts.py``, which prints the requests each store operation costs.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .kv.base import KVStore
    from .url import StoreURL


class FaultKind(StrEnum):
    """What a fault does, whatever the vendor calls it."""

    TRANSIENT = "transient"
    """A retryable server error: throttling, 5xx, a replica moving (429, 503, UNAVAILABLE)."""
    CONFLICT = "conflict"
    """Retryable contention reported by the server (TransactionConflict, 449, ABORTED, 40001)."""
    RESET = "reset"
    """The connection breaks before the request reaches the server: nothing was applied."""
    LOST_REPLY = "lost_reply"
    """The request was applied; its reply never arrives (the SDK sees a broken connection)."""
    STALE_READ = "stale_read"
    """A read served at the item's previous version, as a lagging replica would."""
    BLACKHOLE = "blackhole"
    """The peer accepts the connection and never answers."""


@runtime_checkable
class FaultInjector(Protocol):
    """Injects one backend's routine faults at its SDK's transport (see the module doc).

    The contract opens its KV stores through :meth:`open_kv`, so every store built on them
    (native ports included) sends its requests through the injector.
    """

    faults: Mapping[str, FaultKind]
    """Every fault this injector can inject, by its own name, with its standard kind."""

    async def open_kv(self, url: StoreURL, **options: Any) -> KVStore:
        """A KV store for ``url`` whose requests pass through this injector."""
        ...

    def arm(self, fault: str, *, times: int = 1, operation: str | None = None) -> None:
        """Inject ``fault`` into the next ``times`` requests (only those of ``operation``
        when given: the injector's own operation names, listed in its docs)."""
        ...

    def set_rate(
        self, rate: float, faults: Iterable[str] | None = None, *, seed: int | None = None
    ) -> None:
        """From now on, fault each request with probability ``rate`` (0 stops), choosing
        uniformly among ``faults`` (None: every fault except ``blackhole`` kinds)."""
        ...

    def injected(self) -> dict[str, int]:
        """How many times each fault was injected so far."""
        ...


class BaseFaultInjector:
    """The bookkeeping of a :class:`FaultInjector`; subclasses add ``faults`` and ``open_kv``.

    Thread-safe: some SDKs call their transport hooks from worker threads.
    """

    faults: Mapping[str, FaultKind] = {}

    #: True when the client under test re-sends a write whose reply was lost with no way
    #: for the store to stop it (and nothing, such as an idempotency token the server or
    #: emulator honours, makes the re-send harmless): the contract's linearizability check
    #: then tolerates a write applied once more within its own call. Say why in the
    #: injector's docs; False keeps the check strict.
    resends_writes: bool = False

    #: The faults the service documents as rejections: nothing was applied (throttling,
    #: most often). After one, a store's retry must keep the definite answer — a condition
    #: that then fails is a conflict, not "unknown" (the contract's
    #: ``faults.a_rejected_first_attempt_then_a_real_conflict_is_a_conflict``). None: every
    #: ``transient`` and ``conflict`` fault. Leave out any the service says may have been
    #: applied (a 500 on a write, a timeout).
    rejections: frozenset[str] | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[tuple[str, str | None]] = []
        self._rate = 0.0
        self._choices: list[str] = []
        self._random = random.Random()
        self._counts: Counter[str] = Counter()
        self._requests: Counter[str] = Counter()

    def count_request(self, operation: str) -> None:
        """Count one request the SDK sends (its retries each count): the transport hook
        calls it for every request, faulted or not, before anything else."""
        with self._lock:
            self._requests[operation] += 1

    def requests(self, *, reset: bool = False) -> dict[str, int]:
        """The requests counted so far, by operation (``reset``: and start counting again)."""
        with self._lock:
            counted = dict(self._requests)
            if reset:
                self._requests.clear()
            return counted

    def _known(self, fault: str) -> None:
        if fault not in self.faults:
            raise ValueError(
                f"unknown fault {fault!r}; this injector offers: {', '.join(sorted(self.faults))}"
            )

    def arm(self, fault: str, *, times: int = 1, operation: str | None = None) -> None:
        self._known(fault)
        with self._lock:
            self._armed.extend([(fault, operation)] * times)

    def set_rate(
        self, rate: float, faults: Iterable[str] | None = None, *, seed: int | None = None
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        chosen = (
            [f for f, kind in self.faults.items() if kind is not FaultKind.BLACKHOLE]
            if faults is None
            else list(faults)
        )
        for fault in chosen:
            self._known(fault)
        with self._lock:
            self._rate = rate
            self._choices = chosen
            if seed is not None:
                self._random.seed(seed)

    def disarm(self) -> None:
        """Drop armed faults and stop random ones."""
        with self._lock:
            self._armed.clear()
            self._rate = 0.0

    def injected(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def next_fault(
        self, operation: str | None = None, *, eligible: Iterable[str] | None = None
    ) -> str | None:
        """The fault to inject into this request, or None; counted as injected.

        ``eligible`` limits the choice to the faults this request can carry (a stale read
        only on a read, a lost reply only on a write); an armed fault that is not eligible
        waits for a request that is.
        """
        allowed = None if eligible is None else set(eligible)
        with self._lock:
            for i, (fault, wanted) in enumerate(self._armed):
                if (wanted is None or wanted == operation) and (
                    allowed is None or fault in allowed
                ):
                    del self._armed[i]
                    self._counts[fault] += 1
                    return fault
            if self._rate and self._choices and self._random.random() < self._rate:
                choices = [f for f in self._choices if allowed is None or f in allowed]
                if choices:
                    fault = self._random.choice(choices)
                    self._counts[fault] += 1
                    return fault
        return None

"""Model-based test of the KV contract: random operation sequences checked against a model.

A hypothesis ``RuleBasedStateMachine`` drives create / replace / delete (with and without
an expected version) / get / get_many / scan (prefix, start_after, limit, with and
without values, and full paging) / scopes / drop_scope / commit on scopes whose names
share prefixes, with scope and key names drawn from an awkward alphabet (case, ``/ _ : %``,
backslashes, unicode in different normal forms), over a controlled clock that moves past
TTLs and lands exactly on expiry boundaries (just before, at, just after an entry's
``expires_at``, then probing that entry with one primitive). Every answer of the store is
compared with a small reference model.

The store runs on the test's event loop; hypothesis runs in a worker thread and hands each
operation to the loop (``Runner``), so the store's connections stay on the loop that made them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_stores import ConflictError, KVStore
from agent_stores.kv import Check, Create, Delete, Entry, Operation, Replace
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, Any]], Any]

#: Scope suffixes appended to the example's prefix: the bare prefix, and names that
#: extend it, so a backend that matches scopes by prefix leaks between them.
SCOPE_SUFFIXES = ["", "/", "/a", "a", "A", "_a", ":a", "%2F", "\u00e9", "e\u0301", "\\"]
#: Most operations land on a few scopes, so they meet each other's entries.
scopes_ = st.one_of(st.sampled_from(SCOPE_SUFFIXES[:3]), st.sampled_from(SCOPE_SUFFIXES))

#: Keys reused often (so operations meet the same entries), sharing prefixes, in
#: different cases and Unicode normal forms (NFC "é" vs NFD "e + combining acute",
#: "Å" vs the Ångström sign).
KEY_POOL = [
    "a",
    "A",
    "a/",
    "a/b",
    "a_b",
    "a:b",
    "a%2F",
    "%",
    "ab",
    "b",
    "\u00e9",
    "e\u0301",
    "\u00c5",
    "\u212b",
    "\u65e5\u672c",
    "\U0001f600",
    "a\uffff",
    "a\\b",
    "\ue000",
    "\uffff",
    "\U00010000",
]
#: A handful of keys most operations use, so creates, replaces and deletes collide.
HOT_KEYS = ["a", "a/", "ab", "\u00e9", "\uffff", "\U0001f600"]
ALPHABET = "aAb/_:%.\\ ~\u00e9e\u0301\u00c5\u212b\u65e5\U0001f600\uffff"

keys = st.one_of(
    st.sampled_from(HOT_KEYS),
    st.sampled_from(KEY_POOL),
    st.text(alphabet=ALPHABET, min_size=1, max_size=4),
)
#: A key to operate on: an integer picks one the scope holds or held (most interesting
#: operations meet existing entries), a string is used as it is.
targets = st.one_of(st.integers(min_value=0, max_value=1 << 16), keys)
prefixes = st.one_of(st.just(""), st.sampled_from(KEY_POOL), st.text(alphabet=ALPHABET, max_size=2))
values = st.binary(max_size=24)
# Whole seconds: every expiry is an exact float, whatever precision a backend stores.
ttls = st.sampled_from([None, None, 30, 60, 90])
ticks = st.sampled_from([1, 29, 30, 31, 60, 120])
#: The smallest clock move the suite makes around an expiry: a power of two, so every
#: clock reading and expiry (whole-second TTLs) stays an exact binary fraction.
CLOCK_STEP = 2.0**-10
#: Where a boundary move lands relative to an entry's ``expires_at`` (at it most often).
boundary_sides = st.sampled_from([-CLOCK_STEP, 0.0, 0.0, 0.0, CLOCK_STEP])
#: The primitive that probes the entry whose boundary the clock just reached.
get_probes = st.sampled_from(["get", "get_many"])
scan_probes = st.sampled_from(["scan", "scan-keys", "scan-pages"])
delete_probes = st.sampled_from(["current", None])
commit_probes = st.sampled_from(["create", "replace", "delete", "delete-any", "check"])
# Which expected version an operation passes: the live one, an older one, or garbage.
version_choices = st.sampled_from(["current", "current", "stale", "bogus"])


def _order(key: str) -> bytes:
    return key.encode("utf-8")


@dataclass
class Model:
    """What a correct store holds: ``(scope, key) -> Entry`` on a clock the test moves."""

    now: float
    data: dict[tuple[str, str], Entry] = field(default_factory=dict)
    #: every version the store ever returned, per key (for stale expected versions)
    history: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def live(self, scope: str, key: str) -> Entry | None:
        entry = self.data.get((scope, key))
        if entry is None or entry.expired(self.now):
            return None
        return entry

    def put(self, scope: str, key: str, value: bytes, version: str, ttl: float | None) -> None:
        expires = None if ttl is None else self.now + ttl
        self.data[(scope, key)] = Entry(bytes(value), version, expires)
        self.history.setdefault((scope, key), []).append(version)

    def pending(self) -> list[tuple[float, str, str]]:
        """``(expires_at, scope, key)`` of every entry still live that will expire, in order."""
        return sorted(
            (e.expires_at, s, k)
            for (s, k), e in self.data.items()
            if e.expires_at is not None and e.expires_at > self.now
        )

    def live_keys(self, scope: str, prefix: str = "") -> list[str]:
        found = [
            k
            for (s, k), e in self.data.items()
            if s == scope and k.startswith(prefix) and not e.expired(self.now)
        ]
        return sorted(found, key=_order)


class KVMachine(RuleBasedStateMachine):
    """Random KV operations on ``store``; every answer compared with :class:`Model`.

    A subclass made by :func:`run_model` sets ``store``, ``namespace`` and ``runner``.
    """

    store: KVStore
    namespace: str
    runner: Runner
    examples = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        # A fresh prefix per example: examples never see each other's data.
        # Fixed width: no example's prefix is a prefix of another's ("-1" vs "-10").
        self.prefix = f"{self.namespace}-{type(self).examples:05d}"
        self.model = Model(now=float(int(time.time())))
        self.seen_versions: set[str] = set()
        self.touched: set[str] = set()
        self.store.clock = lambda: self.model.now

    # -- helpers ----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        result: T = self.runner(coro)
        return result

    def scope(self, suffix: str) -> str:
        name = self.prefix + suffix
        self.touched.add(name)
        return name

    def pick(self, scope: str, which: int | str) -> str:
        if isinstance(which, str):
            return which
        known = sorted(
            {k for (s, k) in self.model.data if s == scope}
            | {k for (s, k) in self.model.history if s == scope},
            key=_order,
        )
        pool = known or HOT_KEYS
        return pool[which % len(pool)]

    def expected_version(self, scope: str, key: str, choice: str) -> str:
        live = self.model.live(scope, key)
        old = self.model.history.get((scope, key), [])
        if choice == "current" and live is not None:
            return live.version
        if choice in ("current", "stale") and old:
            stale = [v for v in old if live is None or v != live.version]
            if stale:
                return stale[-1]
        return "not-a-version-of-this-store"

    def fresh(self, version: str, what: str) -> None:
        assert isinstance(version, str) and version, f"{what} returned version {version!r}"
        assert version not in self.seen_versions, (
            f"{what} returned version {version!r}, which the store already gave out"
        )
        self.seen_versions.add(version)

    def check_entry(self, where: str, got: Entry | None, want: Entry | None) -> None:
        if want is None:
            assert got is None, f"{where}: expected nothing, store returned {got!r}"
            return
        assert got is not None, f"{where}: expected {want!r}, store returned nothing"
        assert got.value == want.value, f"{where}: value {got.value!r} != {want.value!r}"
        assert got.version == want.version, f"{where}: version {got.version} != {want.version}"
        if want.expires_at is None:
            assert got.expires_at is None, f"{where}: expires_at {got.expires_at} != None"
        else:
            assert got.expires_at is not None and abs(got.expires_at - want.expires_at) < 0.01, (
                f"{where}: expires_at {got.expires_at} != {want.expires_at}"
            )

    # -- rules --------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        pass

    @rule(suffix=scopes_, which=targets, value=values, ttl=ttls)
    def create(self, suffix: str, which: int | str, value: bytes, ttl: float | None) -> None:
        scope = self.scope(suffix)
        key = self.pick(scope, which)
        where = f"create({scope!r}, {key!r})"
        if self.model.live(scope, key) is not None:
            try:
                self.run(self.store.create(scope, key, value, ttl=ttl))
            except ConflictError:
                return
            raise AssertionError(f"{where} succeeded over a live entry")
        version = self.run(self.store.create(scope, key, value, ttl=ttl))
        self.fresh(version, where)
        self.model.put(scope, key, value, version, ttl)

    @rule(
        suffix=scopes_,
        stem=st.sampled_from(["", "a", "a/", "\u00e9", "\uffff", "\U0001f600"]),
        count=st.integers(min_value=2, max_value=40),
        ttl=ttls,
    )
    def create_many(self, suffix: str, stem: str, count: int, ttl: float | None) -> None:
        # Enough keys in one scope for get_many batches and scan pages to matter.
        scope = self.scope(suffix)
        for i in range(count):
            key = f"{stem}{i:02d}"
            if self.model.live(scope, key) is None:
                version = self.run(self.store.create(scope, key, key.encode(), ttl=ttl))
                self.fresh(version, f"create({scope!r}, {key!r})")
                self.model.put(scope, key, key.encode(), version, ttl)

    @rule(
        suffix=scopes_,
        which=targets,
        value=values,
        ttl=ttls,
        choice=version_choices,
    )
    def replace(
        self, suffix: str, which: int | str, value: bytes, ttl: float | None, choice: str
    ) -> None:
        scope = self.scope(suffix)
        key = self.pick(scope, which)
        expected = self.expected_version(scope, key, choice)
        live = self.model.live(scope, key)
        where = f"replace({scope!r}, {key!r}, expected_version={expected!r})"
        if live is None or live.version != expected:
            try:
                self.run(self.store.replace(scope, key, value, expected_version=expected, ttl=ttl))
            except ConflictError:
                return
            raise AssertionError(f"{where} succeeded though the live version is {live!r}")
        version = self.run(
            self.store.replace(scope, key, value, expected_version=expected, ttl=ttl)
        )
        self.fresh(version, where)
        self.model.put(scope, key, value, version, ttl)

    @rule(
        suffix=scopes_,
        which=targets,
        choice=st.one_of(st.none(), version_choices),
    )
    def delete(self, suffix: str, which: int | str, choice: str | None) -> None:
        scope = self.scope(suffix)
        key = self.pick(scope, which)
        expected = None if choice is None else self.expected_version(scope, key, choice)
        live = self.model.live(scope, key)
        want = live is not None and (expected is None or live.version == expected)
        got = self.run(self.store.delete(scope, key, expected_version=expected))
        assert got is want, (
            f"delete({scope!r}, {key!r}, expected_version={expected!r}) returned {got}, "
            f"expected {want} (live entry: {live!r})"
        )
        if want:
            del self.model.data[(scope, key)]

    @rule(suffix=scopes_, which=targets)
    def get(self, suffix: str, which: int | str) -> None:
        scope = self.scope(suffix)
        key = self.pick(scope, which)
        got = self.run(self.store.get(scope, key))
        self.check_entry(f"get({scope!r}, {key!r})", got, self.model.live(scope, key))

    @rule(
        suffix=scopes_,
        chosen=st.lists(targets, min_size=1, max_size=8),
        include_live=st.booleans(),
    )
    def get_many(self, suffix: str, chosen: list[int | str], include_live: bool) -> None:
        scope = self.scope(suffix)
        asked = [self.pick(scope, t) for t in chosen]
        if include_live:
            # Every live key of the scope too, so completeness is checked on many keys.
            asked = [*asked, *self.model.live_keys(scope)][::-1]
        got = self.run(self.store.get_many(scope, asked))
        want = {k: e for k in asked if (e := self.model.live(scope, k)) is not None}
        where = f"get_many({scope!r}, {asked!r})"
        assert set(got) == set(want), (
            f"{where}: keys {sorted(got, key=_order)} != {sorted(want, key=_order)}"
        )
        for key, entry in want.items():
            self.check_entry(f"{where}[{key!r}]", got[key], entry)

    @rule(
        suffix=scopes_,
        prefix=prefixes,
        after=st.one_of(st.none(), targets),
        limit=st.integers(min_value=1, max_value=50),
        with_values=st.booleans(),
    )
    def scan(
        self, suffix: str, prefix: str, after: int | str | None, limit: int, with_values: bool
    ) -> None:
        scope = self.scope(suffix)
        start_after = None if after is None else self.pick(scope, after)
        got = self.run(
            self.store.scan(
                scope, prefix=prefix, start_after=start_after, limit=limit, values=with_values
            )
        )
        live = self.model.live_keys(scope, prefix)
        if start_after is not None:
            live = [k for k in live if _order(k) > _order(start_after)]
        want = live[:limit]
        where = (
            f"scan({scope!r}, prefix={prefix!r}, start_after={start_after!r}, limit={limit}, "
            f"values={with_values})"
        )
        assert [i.key for i in got] == want, f"{where}: {[i.key for i in got]} != {want}"
        for item in got:
            if with_values:
                self.check_entry(
                    f"{where}[{item.key!r}]", item.entry, self.model.live(scope, item.key)
                )
            else:
                assert item.entry is None, f"{where}: values=False returned an entry"

    @rule(
        suffix=scopes_,
        prefix=prefixes,
        page=st.integers(min_value=1, max_value=7),
    )
    def scan_all_pages(self, suffix: str, prefix: str, page: int) -> None:
        scope = self.scope(suffix)
        seen: list[str] = []
        entries: dict[str, Entry | None] = {}
        start_after: str | None = None
        while True:
            batch = self.run(
                self.store.scan(
                    scope, prefix=prefix, start_after=start_after, limit=page, values=True
                )
            )
            entries.update((i.key, i.entry) for i in batch)
            assert len(batch) <= page, f"scan(limit={page}) returned {len(batch)} items"
            # A page that does not move past start_after would loop forever: fail instead.
            assert start_after is None or all(_order(i.key) > _order(start_after) for i in batch), (
                f"scan(start_after={start_after!r}) returned {[i.key for i in batch]}"
            )
            seen += [i.key for i in batch]
            if len(batch) < page:
                break
            start_after = batch[-1].key
        want = self.model.live_keys(scope, prefix)
        assert seen == want, f"paging {scope!r} by {page} under {prefix!r}: {seen} != {want}"
        for key in seen:
            self.check_entry(f"scan({scope!r})[{key!r}]", entries[key], self.model.live(scope, key))

    @rule(
        start=scopes_,
        start_after=st.one_of(st.none(), scopes_),
        limit=st.integers(min_value=1, max_value=12),
    )
    def scopes(self, start: str, start_after: str | None, limit: int) -> None:
        prefix = self.scope(start)
        after = None if start_after is None else self.scope(start_after)
        got = self.run(self.store.scopes(prefix=prefix, start_after=after, limit=limit))
        names = {
            s
            for (s, k) in self.model.data
            if s.startswith(prefix) and self.model.live(s, k) is not None
        }
        want = sorted((s for s in names if after is None or _order(s) > _order(after)), key=_order)[
            :limit
        ]
        assert got == want, (
            f"scopes(prefix={prefix!r}, start_after={after!r}, limit={limit}): {got} != {want}"
        )

    @rule(suffix=scopes_)
    def drop_scope(self, suffix: str) -> None:
        scope = self.scope(suffix)
        live = self.model.live_keys(scope)
        dropped = self.run(self.store.drop_scope(scope))
        assert dropped >= len(live), (
            f"drop_scope({scope!r}) reported {dropped} deleted, {len(live)} were live"
        )
        for scope_key in [sk for sk in self.model.data if sk[0] == scope]:
            del self.model.data[scope_key]

    @rule(seconds=ticks)
    def tick(self, seconds: int) -> None:
        self.model.now += seconds

    def to_expiry(self, which: int, side: float) -> tuple[str, str]:
        """Move the clock to (or just around) a pending entry's expires_at; its (suffix, key).

        Random ticks rarely stop exactly on an expiry; these moves do, and the rules
        below then probe that entry, so an off-by-one (< for <=) in any primitive meets
        its case.
        """
        pending = self.model.pending()
        if not pending:
            # Nothing will expire: give a hot key an expiry first, so every move lands.
            scope = self.scope(SCOPE_SUFFIXES[which % 3])
            turn = which % len(HOT_KEYS)
            free = [k for k in HOT_KEYS[turn:] + HOT_KEYS[:turn] if not self.model.live(scope, k)]
            key = free[0] if free else f"expiring-{len(self.seen_versions)}"
            self.create(scope[len(self.prefix) :], key, b"expiring", 30)
            pending = self.model.pending()
        expires_at, scope, key = pending[which % len(pending)]
        # Forward only: a store may already have removed what expired.
        self.model.now = max(self.model.now, expires_at + side)
        return scope[len(self.prefix) :], key

    # One rule per primitive: hypothesis enables a random subset of rules per example,
    # so each primitive meets the boundary in most examples.
    @rule(which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides, probe=get_probes)
    def get_at_expiry(self, which: int, side: float, probe: str) -> None:
        suffix, key = self.to_expiry(which, side)
        if probe == "get":
            self.get(suffix, key)
        else:
            self.get_many(suffix, [key], include_live=True)

    @rule(which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides, probe=scan_probes)
    def scan_at_expiry(self, which: int, side: float, probe: str) -> None:
        suffix, key = self.to_expiry(which, side)
        if probe == "scan":
            self.scan(suffix, key[:1], None, 2, True)
        elif probe == "scan-keys":
            self.scan(suffix, "", None, 50, False)
        else:
            # Pages of 1-3 under the entry's first character: the entry meets a page edge.
            self.scan_all_pages(suffix, key[:1], 1 + which % 3)

    @rule(which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides)
    def scopes_at_expiry(self, which: int, side: float) -> None:
        suffix, _ = self.to_expiry(which, side)
        self.scopes(suffix, None, 12)

    @rule(which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides, ttl=ttls)
    def create_at_expiry(self, which: int, side: float, ttl: float | None) -> None:
        suffix, key = self.to_expiry(which, side)
        self.create(suffix, key, b"boundary", ttl)

    @rule(which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides, ttl=ttls)
    def replace_at_expiry(self, which: int, side: float, ttl: float | None) -> None:
        suffix, key = self.to_expiry(which, side)
        # "current" falls back to the version just expired: it must conflict.
        self.replace(suffix, key, b"boundary", ttl, "current")

    @rule(
        which=st.integers(min_value=0, max_value=1 << 16), side=boundary_sides, probe=delete_probes
    )
    def delete_at_expiry(self, which: int, side: float, probe: str | None) -> None:
        suffix, key = self.to_expiry(which, side)
        self.delete(suffix, key, probe)

    @precondition(lambda self: self.store.capabilities.commit)
    @rule(
        which=st.integers(min_value=0, max_value=1 << 16),
        side=boundary_sides,
        probe=commit_probes,
        ttl=ttls,
    )
    def commit_at_expiry(self, which: int, side: float, probe: str, ttl: float | None) -> None:
        suffix, key = self.to_expiry(which, side)
        self.commit(suffix, [(key, probe, "current", b"boundary", ttl)])

    @precondition(lambda self: self.store.capabilities.commit)
    @rule(
        suffix=scopes_,
        plan=st.lists(
            st.tuples(
                targets,
                st.sampled_from(["create", "replace", "delete", "delete-any", "check"]),
                version_choices,
                values,
                ttls,
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def commit(
        self, suffix: str, plan: list[tuple[int | str, str, str, bytes, float | None]]
    ) -> None:
        scope = self.scope(suffix)
        ops: list[Operation] = []
        failing: int | None = None
        resolved = {self.pick(scope, step[0]): step[1:] for step in plan}  # one op per key
        for index, (key, (kind, choice, value, ttl)) in enumerate(resolved.items()):
            op, ok = self._commit_op(scope, key, kind, choice, value, ttl)
            ops.append(op)
            if not ok and failing is None:
                failing = index
        where = f"commit({scope!r}, {ops!r})"
        if failing is not None:
            self._commit_conflicts(scope, ops, failing, where)
            return
        self._commit_applies(scope, ops, where)

    def _commit_op(
        self, scope: str, key: str, kind: str, choice: str, value: bytes, ttl: float | None
    ) -> tuple[Operation, bool]:
        """The commit operation a plan step asks for, and whether the model says it holds."""
        live = self.model.live(scope, key)
        if kind == "create":
            return Create(key, value, ttl), live is None
        if kind == "replace":
            expected = self.expected_version(scope, key, choice)
            return Replace(key, value, expected, ttl), (
                live is not None and live.version == expected
            )
        if kind == "delete":
            expected = self.expected_version(scope, key, choice)
            return Delete(key, expected), live is not None and live.version == expected
        if kind == "delete-any":
            return Delete(key, None), True
        want_version = None if choice == "bogus" else self.expected_version(scope, key, choice)
        return Check(key, want_version), (live.version if live else None) == want_version

    def _commit_conflicts(self, scope: str, ops: list[Operation], failing: int, where: str) -> None:
        """The commit must fail, at the first operation whose condition does not hold."""
        conflict: ConflictError | None = None
        try:
            self.run(self.store.commit(scope, ops))
        except ConflictError as exc:
            conflict = exc
        assert conflict is not None, f"{where} succeeded; operation {failing} should have failed"
        assert conflict.index == failing, f"{where}: conflict index {conflict.index} != {failing}"

    def _commit_applies(self, scope: str, ops: list[Operation], where: str) -> None:
        """The commit must apply every operation: a fresh version for each write."""
        results = self.run(self.store.commit(scope, ops))
        assert len(results) == len(ops), f"{where} returned {results!r}"
        for op, result in zip(ops, results, strict=True):
            if isinstance(op, Create | Replace):
                assert result is not None, f"{where}: no version for {op!r}"
                self.fresh(result, where)
                self.model.put(scope, op.key, op.value, result, op.ttl)
            else:
                assert result is None, f"{where}: {op!r} returned {result!r}"
                if isinstance(op, Delete):
                    self.model.data.pop((scope, op.key), None)

    def teardown(self) -> None:
        # The suite cleans up after itself, also on a shared server.
        for name in sorted(self.touched):
            self.run(self.store.drop_scope(name))


def run_model(store: KVStore, namespace: str, runner: Runner, *, examples: int, steps: int) -> None:
    """Run the state machine on ``store`` for ``examples`` sequences of up to ``steps`` operations."""
    machine = type(
        "KVModelTest",
        (KVMachine,),
        {"store": store, "namespace": namespace, "runner": staticmethod(runner), "examples": 0},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
            # Shrinking a stateful failure can take minutes on a slow backend; the
            # failing sequence is printed as found.
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        ),
    )

"""The linearizability checker: it accepts what a KV store may do and rejects, with a readable window, what it may not."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_stores import BackendUnavailableError, ConflictError
from agent_stores.backends.memory import MemoryKV
from agent_stores.kv import Check, Create, Replace
from agent_stores.kv.faulty import KVFaultInjector
from agent_stores_contract.linearizability import (
    CommitItem,
    History,
    LinearizabilityInconclusive,
    LinearizabilityViolation,
    Op,
    RecordingKV,
    check_history,
    concurrent_pairs,
    run_workload,
)
from broken_backends import ConditionOutsideWrite, Correct, NonAtomicCAS

MS = 1_000_000  # recorded times are nanoseconds
DATA = Path(__file__).parent / "data"


class H:
    """A hand-written history: ``h.op("w1", "create", "k", 0, 2, value="a", result="v1")``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(
        self,
        worker: str,
        kind: Any,
        key: str | tuple[str, ...],
        call: float,
        ret: float | None,
        outcome: Any = "ok",
        *,
        value: str | None = None,
        expected: str | None = None,
        result: Any = None,
        items: tuple[CommitItem, ...] = (),
    ) -> Op:
        if kind == "get" and isinstance(result, tuple):
            result = (result[0].encode(), result[1])
        if kind == "get_many" and isinstance(result, dict):
            result = {k: (v.encode(), ver) for k, (v, ver) in result.items()}
        op = Op(
            id=len(self.ops),
            worker=worker,
            kind=kind,
            keys=(key,) if isinstance(key, str) else key,
            call=int(call * MS),
            ret=None if ret is None else int(ret * MS),
            outcome=outcome,
            value=None if value is None else value.encode(),
            expected=expected,
            items=items,
            result=result,
            error="BackendUnavailableError: lost" if outcome == "unknown" else "",
        )
        self.ops.append(op)
        return op


def violation(ops: list[Op], **kwargs: Any) -> str:
    with pytest.raises(LinearizabilityViolation) as info:
        check_history(ops, **kwargs)
    message = str(info.value)
    print(message)
    return message


def marked(message: str) -> list[str]:
    """The op ids of the window's lines marked '!' (results that contradict each other)."""
    return [line.split()[1] for line in message.splitlines() if line.startswith("  ! #")]


# -- linearizable histories pass -------------------------------------------------------------


def test_sequential_history_passes() -> None:
    h = H()
    h.op("w1", "get", "k", 0, 1, result=None)
    h.op("w1", "create", "k", 2, 3, value="a", result="v1")
    h.op("w1", "get", "k", 4, 5, result=("a", "v1"))
    h.op("w1", "replace", "k", 6, 7, value="b", expected="v1", result="v2")
    h.op("w1", "replace", "k", 8, 9, "conflict", value="c", expected="v1")
    h.op("w1", "delete", "k", 10, 11, expected="v1", result=False)
    h.op("w1", "delete", "k", 12, 13, expected="v2", result=True)
    h.op("w1", "delete", "k", 14, 15, result=False)
    h.op("w1", "create", "k", 16, 17, value="d", result="v3")
    h.op("w1", "delete", "k", 18, 19, result=True)
    report = check_history(h.ops)
    assert report.operations == 10 and report.partitions == 1 and report.unknown == 0


def test_concurrent_operations_may_take_effect_in_either_order() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    # Two replaces from the same version overlap; one wins, the other conflicts.
    h.op("w1", "replace", "k", 2, 10, "conflict", value="b", expected="v1")
    h.op("w2", "replace", "k", 3, 9, value="c", expected="v1", result="v2")
    # Reads overlapping the winner may see before or after it.
    h.op("w3", "get", "k", 4, 5, result=("a", "v1"))
    h.op("w4", "get", "k", 4, 8, result=("c", "v2"))
    h.op("w3", "get", "k", 6, 7, result=("a", "v1"))  # the write landed after 7
    assert check_history(h.ops).concurrent_pairs > 0


def test_keys_are_checked_independently() -> None:
    h = H()
    for n in range(50):
        key = f"k{n % 5}"
        h.op(f"w{n % 5}", "create", key, n * 10, n * 10 + 30, value=f"x{n}", result=f"v{n}")
        h.op(f"w{n % 5}", "delete", key, n * 10 + 31, n * 10 + 32, expected=f"v{n}", result=True)
    report = check_history(h.ops)
    assert report.partitions == 5


def test_get_many_is_one_read_per_key() -> None:
    h = H()
    h.op("w1", "create", "a", 0, 1, value="a1", result="va")
    h.op("w2", "get_many", ("a", "b"), 2, 10, result={"a": ("a1", "va"), "b": ("b1", "vb")})
    h.op("w3", "create", "b", 3, 4, value="b1", result="vb")
    h.op("w1", "delete", "a", 5, 6, result=True)  # the read of a happened before, of b after 4
    assert check_history(h.ops).partitions == 2


def test_get_many_that_sees_a_deleted_key_fails() -> None:
    h = H()
    h.op("w1", "create", "a", 0, 1, value="a1", result="va")
    h.op("w1", "delete", "a", 2, 3, result=True)
    h.op("w2", "get_many", ("a", "b"), 4, 5, result={"a": ("a1", "va")})
    message = violation(h.ops)
    assert "get_many a, b" in message


def test_commit_is_all_or_nothing() -> None:
    h = H()
    h.op("w1", "create", "a", 0, 1, value="a1", result="va1")
    items = (CommitItem("replace", "a", b"a2", "va1"), CommitItem("create", "b", b"b1"))
    h.op("w1", "commit", ("a", "b"), 2, 3, items=items, result=["va2", "vb1"])
    h.op("w2", "get", "a", 4, 5, result=("a2", "va2"))
    h.op("w2", "get", "b", 4, 5, result=("b1", "vb1"))
    failing = (CommitItem("check", "a", None, "va1"), CommitItem("delete", "b", None, None))
    h.op("w1", "commit", ("a", "b"), 6, 7, "conflict", items=failing, result=0)
    h.op("w2", "get", "b", 8, 9, result=("b1", "vb1"))
    assert check_history(h.ops).partitions == 1


def test_half_a_commit_seen_fails() -> None:
    h = H()
    items = (CommitItem("create", "a", b"a1"), CommitItem("create", "b", b"b1"))
    h.op("w1", "commit", ("a", "b"), 0, 1, items=items, result=["va", "vb"])
    h.op("w2", "get", "a", 2, 3, result=("a1", "va"))
    h.op("w2", "get", "b", 4, 5, result=None)
    message = violation(h.ops)
    assert "commit [create a = 'a1'; create b = 'b1']" in message


# -- non-linearizable histories fail, with the window printed --------------------------------


def test_stale_read_after_a_completed_write_fails() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "replace", "k", 2, 3, value="b", expected="v1", result="v2")
    h.op("w2", "get", "k", 4, 5, result=("a", "v1"))
    message = violation(h.ops)
    assert "not linearizable on key 'k'" in message
    assert "replace k = 'b' if v1" in message and "'a' @ v1" in message
    assert set(marked(message)) == {"#1", "#2"}  # the write and the stale read
    assert "versions: v1 = 'v1', v2 = 'v2'" in message


def test_two_successful_creates_of_one_key_fail() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 5, value="a", result="v1")
    h.op("w2", "create", "k", 1, 6, value="b", result="v2")
    message = violation(h.ops)
    assert set(marked(message)) == {"#0", "#1"}
    assert message.count("create k") == 2


def test_replace_succeeding_on_a_superseded_version_fails() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "replace", "k", 2, 3, value="b", expected="v1", result="v2")
    h.op("w2", "replace", "k", 4, 5, value="c", expected="v1", result="v3")
    message = violation(h.ops)
    assert set(marked(message)) == {"#1", "#2"}
    assert "replace k = 'c' if v1" in message


def test_a_conflict_where_nothing_could_conflict_fails() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, "conflict", value="a")
    h.op("w1", "get", "k", 2, 3, result=None)
    violation(h.ops)


def test_reused_version_fails() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "delete", "k", 2, 3, result=True)
    h.op("w1", "create", "k", 4, 5, value="b", result="v1")
    message = violation(h.ops)
    assert "same version twice" in message


def test_the_window_is_small_in_a_long_history() -> None:
    h = H()
    version = "v0"
    h.op("w0", "create", "k", 0, 1, value="x0", result=version)
    t = 2
    for n in range(1, 120):
        new = f"v{n}"
        h.op(f"w{n % 6}", "replace", "k", t, t + 3, value=f"x{n}", expected=version, result=new)
        h.op(f"w{(n + 1) % 6}", "get", "k", t + 1, t + 5, result=(f"x{n}", new))
        h.op(f"w{(n + 2) % 6}", "get", "other", t, t + 1, result=None)
        version, t = new, t + 6
    h.op("w9", "get", "k", t, t + 1, result=("x50", "v50"))  # stale
    for n in range(20):
        h.op("w8", "get", "k", t + 2 + n, t + 2.5 + n, result=(f"x{119}", "v119"))
    message = violation(h.ops)
    assert len(marked(message)) <= 3, message
    assert "'x50' @ " in message


# -- unknown outcomes -----------------------------------------------------------------------


def test_an_unknown_write_may_have_happened() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "replace", "k", 2, None, "unknown", value="b", expected="v1")
    h.op("w2", "get", "k", 10, 11, result=("b", "v9"))  # it happened, and had version v9
    h.op("w2", "replace", "k", 12, 13, value="c", expected="v9", result="v10")
    assert check_history(h.ops).unknown == 1


def test_an_unknown_write_may_never_have_happened() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "replace", "k", 2, None, "unknown", value="b", expected="v1")
    h.op("w2", "get", "k", 10, 11, result=("a", "v1"))
    h.op("w2", "replace", "k", 12, 13, value="c", expected="v1", result="v2")
    check_history(h.ops)


def test_an_unknown_write_explains_a_later_conflict() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "delete", "k", 2, None, "unknown")
    h.op("w2", "replace", "k", 20, 21, "conflict", value="c", expected="v1")
    h.op("w2", "create", "k", 22, 23, value="d", result="v2")
    check_history(h.ops)


def test_an_unknown_write_cannot_act_before_its_call() -> None:
    h = H()
    h.op("w1", "create", "k", 5, None, "unknown", value="a")
    h.op("w2", "get", "k", 0, 1, result=("a", "v1"))
    message = violation(h.ops)
    assert "? BackendUnavailableError" in message


def test_an_unknown_write_happens_at_most_once() -> None:
    h = H()
    h.op("w1", "create", "k", 0, None, "unknown", value="a")
    h.op("w2", "get", "k", 1, 2, result=("a", "v1"))
    h.op("w2", "delete", "k", 3, 4, result=True)
    h.op("w2", "get", "k", 5, 6, result=("a", "v1"))
    violation(h.ops)


def test_a_refusal_under_faults_may_echo_our_own_write() -> None:
    # The write landed, its reply was lost, the SDK resent it and met itself.
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "replace", "k", 2, 3, "conflict", value="b", expected="v1")
    h.op("w2", "get", "k", 4, 5, result=("b", "v2"))
    violation(h.ops)  # without faults a conflict is definite
    check_history(h.ops, resent_writes=True)
    # ... but only within the call: it cannot land after the call returned.
    h.op("w2", "get", "k", 6, 7, result=("a", "v1"))
    violation(h.ops, resent_writes=True)


def test_a_delete_refusal_under_faults_may_echo_our_own_delete() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    h.op("w1", "delete", "k", 2, 3, expected="v1", result=False)
    h.op("w2", "get", "k", 4, 5, result=None)
    violation(h.ops)
    check_history(h.ops, resent_writes=True)


def test_a_resent_create_may_land_twice() -> None:
    # The first attempt landed (v1) and was deleted by w2 before the resend created it again.
    h = H()
    h.op("w1", "create", "k", 0, 10, value="a", result="v2")
    h.op("w2", "get", "k", 1, 2, result=("a", "v1"))
    h.op("w2", "delete", "k", 3, 4, expected="v1", result=True)
    h.op("w2", "get", "k", 11, 12, result=("a", "v2"))
    violation(h.ops)
    check_history(h.ops, resent_writes=True)


def test_resent_writes_still_catch_the_classic_violations() -> None:
    stale = H()
    stale.op("w1", "create", "k", 0, 1, value="a", result="v1")
    stale.op("w1", "replace", "k", 2, 3, value="b", expected="v1", result="v2")
    stale.op("w2", "get", "k", 4, 5, result=("a", "v1"))
    violation(stale.ops, resent_writes=True)
    twice = H()
    twice.op("w1", "create", "k", 0, 5, value="a", result="v1")
    twice.op("w2", "create", "k", 1, 6, value="b", result="v2")
    violation(twice.ops, resent_writes=True)
    lost_update = H()
    lost_update.op("w1", "create", "k", 0, 1, value="a", result="v1")
    lost_update.op("w1", "replace", "k", 2, 5, value="b", expected="v1", result="v2")
    lost_update.op("w2", "replace", "k", 3, 6, value="c", expected="v1", result="v3")
    violation(lost_update.ops, resent_writes=True)


def test_the_search_is_bounded() -> None:
    h = H()
    h.op("w1", "create", "k", 0, 1, value="a", result="v1")
    for n in range(30):
        h.op(f"u{n}", "replace", "k", 2 + n, None, "unknown", value=f"b{n}", expected="v1")
    # the read names the last unknown write's effect: the search tries the others first
    h.op("w2", "get", "k", 100, 101, result=("b29", "v9"))
    with pytest.raises(LinearizabilityInconclusive, match="gave up after 5 steps"):
        check_history(h.ops, max_steps=5)
    check_history(h.ops)


def test_a_history_past_the_old_bound_is_decided_well_inside_it() -> None:
    """A recorded run (memory://, 20 % faults, workload seed ``ct-6bf132a71d64``) whose
    partition of k0 and k1 took the search without its two reductions over 8,000,000
    steps (past the default bound: the contract test failed as inconclusive). Decided
    linearizable, and far inside the bound."""
    history = History()
    history.extend_json(json.loads((DATA / "history_past_the_old_bound.json").read_text()))
    report = check_history(history, resent_writes=True)
    assert report.operations == 240 and report.unknown == 35
    assert report.steps < 500_000


def test_records_round_trip_through_json() -> None:
    h = H()
    h.op("w1", "get", "k", 0, 1, result=("a\u00e9", "v1"))
    h.op("w1", "get_many", ("a", "b"), 0, 1, result={"a": ("x", "v")})
    items = (CommitItem("replace", "a", b"\x00\xff", "v"), CommitItem("check", "b", None, None))
    h.op("w1", "commit", ("a", "b"), 2, None, "unknown", items=items)
    history = History()
    history.extend_json([op.to_json() for op in h.ops])
    assert [o.to_json() for o in history.ops] == [o.to_json() for o in h.ops]
    assert history.ops[0].result == ("a\u00e9".encode(), "v1")


# -- the recorder and the workload ------------------------------------------------------------


class Flaky(MemoryKV):
    """Every third write is applied and then its reply is lost."""

    calls = 0

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        version = await super()._create(scope, key, value, expires_at, now)
        Flaky.calls += 1
        if Flaky.calls % 3 == 0:
            raise BackendUnavailableError(detail="reply lost (test)")
        return version


async def test_recorder_records_every_outcome() -> None:
    history = History()
    kv = Flaky(f"lin-{uuid.uuid4().hex}")
    kv.deadline_seconds = None
    rec = RecordingKV(kv, "s", "w1", history)
    Flaky.calls = 0
    version = await rec.create("a", b"1")
    with pytest.raises(ConflictError):
        await rec.create("a", b"2")
    vb = await rec.create("b", b"3")
    with pytest.raises(BackendUnavailableError):
        await rec.create("c", b"4")
    entry = await rec.get("a")
    assert entry is not None and entry.version == version
    assert set(await rec.get_many(["a", "c", "z"])) == {"a", "c"}
    with pytest.raises(ConflictError):
        await rec.commit([Check("a", version), Create("b", b"5")])
    results = await rec.commit([Check("a", version), Replace("b", b"6", vb)])
    assert results[0] is None and results[1] is not None
    assert await rec.delete("a", version) is True
    outcomes = [(op.kind, op.outcome) for op in history.ops]
    assert outcomes == [
        ("create", "ok"),
        ("create", "conflict"),
        ("create", "ok"),
        ("create", "unknown"),
        ("get", "ok"),
        ("get_many", "ok"),
        ("commit", "conflict"),
        ("commit", "ok"),
        ("delete", "ok"),
    ]
    unknown = history.ops[3]
    assert unknown.ret is None and "reply lost" in unknown.error
    assert history.ops[6].result == 1  # the failing index of the commit
    assert history.ops[7].result == results
    assert all(op.ret is None or op.ret >= op.call for op in history.ops)
    check_history(history)  # the lost create of c happened: get_many saw it


async def _workload(cls: type[MemoryKV], seed: int) -> History:
    name = f"lin-{uuid.uuid4().hex}"
    clients = [cls(name) for _ in range(4)]
    history = History()
    await run_workload(clients, "s", history, tasks=8, ops=40, seed=seed, use_commit=True)
    return history


async def test_the_workload_on_a_correct_store_is_linearizable() -> None:
    for seed in range(3):
        history = await _workload(Correct, seed)
        report = check_history(history)
        assert report.operations == 320
        assert concurrent_pairs(history.ops) > 0
        assert report.by_outcome.get("conflict", 0) > 0


@pytest.mark.parametrize("broken", [ConditionOutsideWrite, NonAtomicCAS])
async def test_the_workload_reports_a_condition_checked_outside_the_write(
    broken: type[MemoryKV],
) -> None:
    caught = 0
    for seed in range(3):
        history = await _workload(broken, seed)
        try:
            check_history(history)
        except LinearizabilityViolation as exc:
            message = str(exc)
            assert "history is not linearizable" in message
            assert 1 <= len(marked(message)) <= 12, message
            caught += 1
    assert caught == 3


async def _faulted_workload(cls: type[MemoryKV], seed: int) -> tuple[History, dict[str, int]]:
    injector = KVFaultInjector()
    injector.set_rate(0.2, seed=seed)
    name = f"lin-{uuid.uuid4().hex}"
    clients = [injector.wrap(cls(name)) for _ in range(4)]
    history = History()
    await run_workload(clients, "s", history, tasks=8, ops=30, seed=seed, use_commit=True)
    return history, injector.injected()


async def test_the_faulted_workload_on_a_correct_store_is_linearizable() -> None:
    for seed in range(10):
        history, injected = await _faulted_workload(Correct, seed)
        report = check_history(history, resent_writes=True)
        assert report.unknown > 0 and sum(injected.values()) > 0, (report, injected)


@pytest.mark.parametrize("broken", [ConditionOutsideWrite, NonAtomicCAS])
async def test_the_faulted_workload_still_reports_a_broken_store(broken: type[MemoryKV]) -> None:
    caught = 0
    for seed in range(3):
        history, _ = await _faulted_workload(broken, seed)
        with contextlib.suppress(LinearizabilityViolation):
            check_history(history, resent_writes=True)
            continue
        caught += 1
    assert caught >= 2, f"only {caught} of 3 faulted runs caught {broken.__name__}"


async def test_a_large_history_checks_quickly_enough() -> None:
    more = History()
    name = f"lin-{uuid.uuid4().hex}"
    await run_workload([Correct(name) for _ in range(2)], "s", more, tasks=10, ops=40, seed=8)
    report = check_history(more)
    assert report.operations == 400
    # The budget is a count of model steps, not time: far below it.
    assert report.steps < 100_000, report

"""
A global bound on reconcile reads (issue 17, item 8; reconcile/read_slots.py): the gate runs at most
`reads_max` reads at once; the others wait their turn, at most the read timeout each, and a reconcile
that needs no read takes no slot. The gate is driven directly (as tests/gate/test_admission.py: a real
store on its own thread, the real upstream of tests/upstream.py, which counts the reads of a path in
progress at once, `Upstream.reads_at_once`, and the writes). Through a real mitmdump with 40 unknown
outcomes: tests/e2e/reconcile/test_read_bound.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterator

import pytest

from proxy_addon.gate.admission import Gate, GateSettings
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.reconcile.http_reads import ReadSettings
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store
from tests.gate.test_admission import CREDENTIALS, RULES, World, duplicates, forward_through, transitions
from tests.upstream import Upstream

# tests/gate/test_admission.py's rules, and an API that deduplicates by a key and has no read (like Stripe's).
KEYED_RULES = (
    RULES
    + """\
  keyed.create:
    match: {method: POST, path: "/api/{bucket}/keyed"}
    fingerprint: {body: [title]}
    external_id: id
    idempotency_key: {header: Idempotency-Key}
"""
)


@pytest.fixture(scope="module")
def held_upstream() -> Iterator[Upstream]:
    """An upstream of this module's own: its held reads wait up to 30 s for let_go (the shared one: 8 s)."""
    with Upstream(hang_seconds=30) as up:
        yield up


@pytest.fixture
def world(tmp_path, held_upstream, bucket) -> Iterator[World]:
    w = World(held_upstream, bucket, tmp_path, rules=RuleSet.of([load_rules(KEYED_RULES, "gate-test.yaml")]))
    yield w
    w.upstream.let_go(w.path())  # no read of this test left waiting in the upstream
    for calls in w.threads:
        calls.close()


def gate_of(w: World, *, reads_max: int, timeout: float = 30) -> Gate:
    """A gate (one proxy process) over its own store connection, with the read bound and read timeout given."""
    calls = StoreThread(Store.open(w.db, clock=w.clock))
    w.threads.append(calls)
    return Gate(calls, GateSettings(reads=ReadSettings(timeout=timeout), reads_max=reads_max))


async def unknown_receipts(w: World, gate: Gate, n: int) -> list[tuple[str, Receipt]]:
    """`n` different writes the upstream commits and then drops: (title, its outcome_unknown receipt)."""
    made = []
    for i in range(n):
        title = f"bound-{i}"
        w.upstream.plan(w.path(), "drop")
        attempt, op = w.attempt(title=title)
        admitted, receipt = await forward_through(gate, w, attempt, op, title=title)
        assert admitted.decision.kind == "forward"
        assert receipt is not None and receipt.state is State.OUTCOME_UNKNOWN
        made.append((title, receipt))
    assert w.upstream.seen(w.path()) == n
    return made


async def until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def states(w: World) -> dict[State, int]:
    return dict(collections.Counter(r.state for r in w.receipts()))


async def test_the_gate_runs_at_most_reads_max_reads_and_the_others_wait_their_turn(world):
    gate = gate_of(world, reads_max=2)
    made = await unknown_receipts(world, gate, 6)
    path = world.path()
    world.upstream.plan_read(path, *["held"] * 6)
    _, op = world.attempt()
    dups = [asyncio.create_task(gate.admit(world.attempt(title=t)[0], op, CREDENTIALS)) for t, _ in made]

    await until(lambda: world.upstream.reads_at_once(path)[0] >= 2, what="two reads held by the upstream")
    await asyncio.sleep(0.5)  # room for the other four to start, were there no bound
    assert world.upstream.reads_at_once(path) == (2, 2), "(reads held now, the most at once)"
    assert world.upstream.reads(path) == 2
    assert not any(d.done() for d in dups)
    assert gate.reads_in_progress() == 6  # the four waiting for a slot count: a stopping proxy waits for them
    # A receipt whose read waits for a slot is not claimed: only the two being read are reconciling.
    assert states(world) == {State.RECONCILING: 2, State.OUTCOME_UNKNOWN: 4}

    world.upstream.let_go(path)
    results = await asyncio.wait_for(asyncio.gather(*dups), 20)
    assert [r.decision.kind for r in results] == ["blocked_succeeded"] * 6
    assert world.upstream.reads_at_once(path) == (0, 2)
    assert world.upstream.reads(path) == 6  # one read each
    assert world.upstream.seen(path) == 6  # and no write
    assert states(world) == {State.SUCCEEDED: 6}
    for _, receipt in made:
        assert transitions(world.events(receipt.operation_id)) == [
            (None, "submitted"),
            ("submitted", "outcome_unknown"),
            ("outcome_unknown", "reconciling"),
            ("reconciling", "succeeded"),
        ]
    assert gate.reads_in_progress() == 0


async def test_a_read_waits_for_a_slot_at_most_the_read_timeout_and_then_reads_and_records_nothing(world, caplog):
    """
    One slot, a read timeout of T = 1.5 s, and three reads the upstream holds: A's read starts at
    once and fails at T; B (asked 0.5 s after A) gets the slot then and has all of T for its own
    read; C (asked 1 s after A) is still waiting at its T and gives up: no read, no claim, no
    failed read counted, and its duplicate gets the 409 of an unknown outcome.
    """
    timeout = 1.5
    gate = gate_of(world, reads_max=1, timeout=timeout)
    (a, ra), (b, rb), (c, rc) = await unknown_receipts(world, gate, 3)
    path = world.path()
    world.upstream.plan_read(path, "held", "held", "held")
    _, op = world.attempt()

    async def duplicate(title: str):
        started = time.monotonic()
        admitted = await gate.admit(world.attempt(title=title)[0], op, CREDENTIALS)
        return admitted, time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="proxy_addon.gate.admission"):
        ta = asyncio.create_task(duplicate(a))
        await until(lambda: world.upstream.reads(path) == 1, what="A's read")
        await asyncio.sleep(0.5)
        tb = asyncio.create_task(duplicate(b))
        await asyncio.sleep(0.5)
        tc = asyncio.create_task(duplicate(c))
        dc, waited_c = await asyncio.wait_for(tc, 10)

        assert timeout - 0.2 <= waited_c < timeout + 0.8, waited_c
        assert world.upstream.reads(path) == 2  # A's and B's; none for C
        assert not tb.done()  # B's read runs on
        assert (dc.decision.kind, dc.decision.receipt.state) == ("blocked", State.OUTCOME_UNKNOWN)
        after_c = {r.operation_id: r for r in world.receipts()}[rc.operation_id]
        assert (after_c.state, after_c.failed_reads, after_c.next_read_at) == (State.OUTCOME_UNKNOWN, 0, None)
        events_c = world.events(rc.operation_id)
        assert transitions(events_c) == [(None, "submitted"), ("submitted", "outcome_unknown")]
        assert duplicates(events_c) == [("blocked", "outcome_unknown")]
        (said,) = [m for m in (r.getMessage() for r in caplog.records) if rc.operation_id in m and "not read" in m]
        assert "not read: no read slot came free within 1.5s" in said and "receipts_reads_max" in said

        (da, _), (db, waited_b) = await asyncio.wait_for(asyncio.gather(ta, tb), 10)
    # B waited about 1 s for its slot, then its read had all of T: the wait did not shorten it.
    assert waited_b >= 2 * timeout - 0.5 - 0.3, waited_b
    after = {r.operation_id: r for r in world.receipts()}
    for d, r in ((da, ra), (db, rb)):
        assert (d.decision.kind, d.decision.receipt.state) == ("blocked", State.OUTCOME_UNKNOWN)
        assert after[r.operation_id].failed_reads == 1  # their own reads timed out: failed reads
        (read,) = [e.reason for e in world.events(r.operation_id) if e.from_state is State.RECONCILING]
        assert "failed: ReadTimeout; failed read 1 of 3" in read
    assert world.upstream.reads(path) == 2
    assert world.upstream.seen(path) == 3


async def test_a_receipt_waiting_for_a_slot_stays_unknown_and_another_process_may_settle_it(world):
    """The slot is taken before the claim: while B's read waits here, another proxy process reads
    and settles B; when the slot comes, B's claim fails and its duplicate gets what was recorded."""
    gate = gate_of(world, reads_max=1)
    other = gate_of(world, reads_max=1)  # another proxy process on the same database
    (a, _), (b, rb) = await unknown_receipts(world, gate, 2)
    path = world.path()
    world.upstream.plan_read(path, "held")  # A's read only
    _, op = world.attempt()
    ta = asyncio.create_task(gate.admit(world.attempt(title=a)[0], op, CREDENTIALS))
    await until(lambda: world.upstream.reads(path) == 1, what="A's read")
    tb = asyncio.create_task(gate.admit(world.attempt(title=b)[0], op, CREDENTIALS))
    await asyncio.sleep(0.3)
    assert not tb.done()
    assert {r.operation_id: r.state for r in world.receipts()}[rb.operation_id] is State.OUTCOME_UNKNOWN

    settled = await other.admit(world.attempt(title=b)[0], op, CREDENTIALS)
    assert settled.decision.kind == "blocked_succeeded"
    assert world.upstream.reads(path) == 2

    world.upstream.let_go(path)
    da, db = await asyncio.wait_for(asyncio.gather(ta, tb), 10)
    assert (da.decision.kind, db.decision.kind) == ("blocked_succeeded", "blocked_succeeded")
    assert world.upstream.reads(path) == 2  # B's read, when its slot came, found B settled: no read of its own
    assert transitions(world.events(rb.operation_id)).count(("outcome_unknown", "reconciling")) == 1
    assert world.upstream.seen(path) == 2


async def test_a_reconcile_that_needs_no_read_takes_no_slot(world):
    """While the one slot is held by a hanging read, a duplicate of an unknown outcome whose API
    deduplicates by its key (no read configured) is decided at once: safe_to_retry, sent again."""
    gate = gate_of(world, reads_max=1)
    ((a, _),) = await unknown_receipts(world, gate, 1)
    world.upstream.plan(world.path("keyed"), "drop")
    attempt, keyed = world.attempt("keyed")
    _, first = await forward_through(gate, world, attempt, keyed, "keyed")
    assert first is not None and first.state is State.OUTCOME_UNKNOWN
    path = world.path()
    world.upstream.plan_read(path, "held")
    _, op = world.attempt()
    ta = asyncio.create_task(gate.admit(world.attempt(title=a)[0], op, CREDENTIALS))
    await until(lambda: world.upstream.reads_at_once(path)[0] == 1, what="the read holding the slot")

    started = time.monotonic()
    dup = await asyncio.wait_for(gate.admit(world.attempt("keyed")[0], keyed, CREDENTIALS), 10)
    assert time.monotonic() - started < 2.5  # at once (0.05 s quiet), not behind the held read (5 s read timeout)
    assert (dup.decision.kind, dup.decision.receipt.retry_of) == ("forward", first.operation_id)
    assert {r.operation_id: r.state for r in world.receipts()}[first.operation_id] is State.SAFE_TO_RETRY
    assert not ta.done()  # the read still holds the slot
    world.upstream.let_go(path)
    assert (await asyncio.wait_for(ta, 10)).decision.kind == "blocked_succeeded"

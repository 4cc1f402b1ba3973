"""
Decisions per intent on one PostgreSQL store (store/postgres.py, "One winner per intent"), with
the session's throwaway PostgreSQL (tests/pg.py): each writer has its own store, on its own
connection, in its own thread.

- a decision of one intent, held open inside its transaction, leaves another intent's writer free
  to decide and commit meanwhile; a writer of the same intent waits on its lock (pg_stat_activity
  says so), then is answered as a duplicate;
- 64 writers of one intent at once (half of them also naming an earlier fingerprint, so their lock
  sets differ) make exactly one receipt, and exactly one of them is told to forward;
- the takeover of an expired instance's receipt, held open, keeps a new attempt of its intent
  waiting (then blocked: one winner), while another intent's attempt goes on;
- the lock key the server computes from a receipt's row is the one a proxy computes from its
  fingerprint;
- a committed event is notified (after its commit, store/postgres.py), a rolled-back one never;
- a write of a receipt not (yet) in its snapshot takes the whole store's lock instead.

A writer is held inside its transaction by its store's clock (`clock=`, called once the transaction
holds its locks), which waits at a threading.Event: no mocks, no timings asserted.
"""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

from proxy_addon.errors import StoreUnavailable, UnknownReceipt
from proxy_addon.gate.leases import recover_expired
from proxy_addon.states import State
from proxy_addon.store import Attempt, PostgresStore
from proxy_addon.store.records import utcnow
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e


def attempt(fp: str, *, instance: str | None = None, earlier: tuple[str, ...] = ()) -> Attempt:
    return Attempt(
        api="example",
        operation="articles.create",
        method="POST",
        target="https://api.example/a",
        intent_fingerprint=fp,
        intent={"t": fp},
        principal="agent-1",
        flow_id="f",
        instance=instance,
        earlier=earlier,
    )


class HeldClock:
    """A store's clock that, armed, stops the first transaction that reads it until `release`."""

    def __init__(self) -> None:
        self.armed = False
        self.inside = threading.Event()
        self.go = threading.Event()

    def __call__(self):
        if self.armed:
            self.armed = False
            self.inside.set()
            assert self.go.wait(timeout=120), "the held transaction was never released"
        return utcnow()


class Held:
    """`call` in a thread of its own, stopped inside its transaction by `clock` until `release`."""

    def __init__(self, clock: HeldClock, call):
        self.clock = clock
        self.result: object = None
        self.error: BaseException | None = None
        clock.armed = True

        def run():
            try:
                self.result = call()
            except BaseException as e:  # told to the test by `finish`
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert clock.inside.wait(timeout=60), "the held call never reached its transaction"

    def finish(self):
        self.clock.go.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


def in_thread(call) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def waits_on_a_lock(pg_url: str, pid: int) -> bool:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row == ("Lock", "advisory")


def test_distinct_intents_decide_and_commit_while_another_holds_its_decision_open(pg_url):
    clock = HeldClock()
    a = PostgresStore.open(pg_url, clock=clock)
    b = PostgresStore.open(pg_url, lock_timeout=60)
    c = PostgresStore.open(pg_url, lock_timeout=60)
    try:
        held = Held(clock, lambda: a.begin_attempt(attempt("fp-held")))
        # Another intent: decided and committed while fp-held's transaction is open (on one global
        # lock it would wait for it, and this join would end with the thread still waiting).
        other, out = in_thread(lambda: b.begin_attempt(attempt("fp-other")))
        other.join(timeout=60)
        assert not other.is_alive(), "a writer of another intent waited for the held decision"
        assert out["result"].kind == "forward"
        assert [r.intent_fingerprint for r in c.list(limit=None)] == ["fp-other"]  # committed; fp-held not yet
        # The same intent: waits on its intent's lock until the held decision commits, then is a duplicate.
        assert c.conn is not None
        same, same_out = in_thread(lambda: c.begin_attempt(attempt("fp-held")))
        wait_for(
            lambda: waits_on_a_lock(pg_url, c.conn.info.backend_pid),
            timeout=60,
            what="the same intent's writer to wait on its lock",
        )
        assert same.is_alive()
        assert held.finish().kind == "forward"
        same.join(timeout=60)
        assert same_out["result"].kind == "blocked"
        assert Counter(r.intent_fingerprint for r in c.list(limit=None)) == {"fp-held": 1, "fp-other": 1}
    finally:
        clock.go.set()
        for s in (a, b, c):
            s.close()


def test_a_storm_of_64_writers_of_one_intent_has_exactly_one_winner(pg_url):
    setup = PostgresStore.open(pg_url)
    earlier = "fp-storm-scheme-2"
    first = setup.begin_attempt(attempt(earlier))  # an earlier scheme's receipt of the intent, proven not sent
    setup.transition(first.receipt.operation_id, State.NOT_SENT, reason="refused before sending")
    stores = [PostgresStore.open(pg_url, lock_timeout=60) for _ in range(64)]
    barrier = threading.Barrier(64)
    kinds: list[str] = []
    errors: list[BaseException] = []

    def writer(i: int):
        try:
            barrier.wait(timeout=120)
            # Half know the earlier fingerprint (their lock set is two intents, taken in key order), half do not.
            a = attempt("fp-storm", earlier=(earlier,) if i % 2 else ())
            kinds.append(stores[i].begin_attempt(a).kind)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(64)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert Counter(kinds) == {"forward": 1, "blocked": 63}
        storm = [r for r in setup.list(limit=None) if r.intent_fingerprint == "fp-storm"]
        assert len(storm) == 1 and storm[0].state is State.SUBMITTED
    finally:
        for s in [setup, *stores]:
            s.close()


def test_a_takeover_held_open_keeps_a_new_attempt_of_its_intent_waiting_and_leaves_others_free(pg_url):
    clock = HeldClock()
    live = PostgresStore.open(pg_url, clock=clock)
    dead = PostgresStore.open(pg_url)
    again = PostgresStore.open(pg_url, lock_timeout=60)
    other = PostgresStore.open(pg_url, lock_timeout=60)
    try:
        for s, name in ((live, "live-1"), (again, "live-2"), (other, "live-3"), (dead, "dead-1")):
            s.claim_lease(name, "host", 1, 300)
        theirs = dead.begin_attempt(attempt("fp-taken", instance="dead-1")).receipt.operation_id
        dead._execute("UPDATE receipt_instances SET expires_at = now() - interval '1 second' WHERE instance = 'dead-1'")
        takeover = Held(clock, lambda: recover_expired(live, "live-1"))  # held inside the receipt's transition
        free, free_out = in_thread(lambda: other.begin_attempt(attempt("fp-free", instance="live-3")))
        free.join(timeout=60)
        assert not free.is_alive(), "another intent's attempt waited for the takeover"
        assert free_out["result"].kind == "forward"
        assert again.conn is not None
        retry, retry_out = in_thread(lambda: again.begin_attempt(attempt("fp-taken", instance="live-2")))
        wait_for(
            lambda: waits_on_a_lock(pg_url, again.conn.info.backend_pid),
            timeout=60,
            what="the new attempt of the taken-over intent to wait on its lock",
        )
        assert takeover.finish() == [(theirs, "outcome_unknown")]
        retry.join(timeout=60)
        assert retry_out["result"].kind == "blocked"  # outcome_unknown is unresolved: one winner, still
        assert retry_out["result"].receipt.state is State.OUTCOME_UNKNOWN
        taken = [r for r in again.list(limit=None) if r.intent_fingerprint == "fp-taken"]
        assert [r.operation_id for r in taken] == [theirs]
    finally:
        clock.go.set()
        for s in (live, dead, again, other):
            s.close()


def test_the_lock_key_from_a_receipt_row_is_the_proxys_from_its_fingerprint(pg_url):
    from proxy_addon.store.postgres import KEY_SQL, intent_key

    store = PostgresStore.open(pg_url)
    try:
        fps = ["sha256:" + "ab" * 32, "v3:ünïcode-fp", "fp-1"]
        for fp in fps:
            store.begin_attempt(attempt(fp))
        rows = store._rows(f"SELECT intent_fingerprint, {KEY_SQL} AS key FROM receipts")
        assert {r["intent_fingerprint"]: r["key"] for r in rows} == {fp: intent_key(fp) for fp in fps}
        assert len({intent_key(fp) for fp in fps}) == 3
    finally:
        store.close()


def test_a_held_intent_lock_is_unavailable_within_the_lock_timeout(pg_url):
    from proxy_addon.store.postgres import intent_key

    store = PostgresStore.open(pg_url, lock_timeout=0.3)
    blocker = psycopg.connect(pg_url, autocommit=True)
    try:
        blocker.execute("BEGIN")
        blocker.execute("SELECT pg_advisory_xact_lock(%s)", (intent_key("fp-locked"),))
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            store.begin_attempt(attempt("fp-locked"))
        assert store.begin_attempt(attempt("fp-unlocked")).kind == "forward"  # another intent: free
        blocker.execute("ROLLBACK")
        assert store.begin_attempt(attempt("fp-locked")).kind == "forward"
    finally:
        blocker.close()
        store.close()


def test_each_committed_event_is_notified_after_its_commit_and_a_rolled_back_one_never(pg_url):
    from proxy_addon.store.postgres import CHANNEL

    store = PostgresStore.open(pg_url)
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL}")
        forwarded = store.begin_attempt(attempt("fp-notified")).receipt.operation_id
        with pytest.raises(RuntimeError), store._write(intents=("fp-rolled-back",)):
            store._event(forwarded, "blocked", State.SUBMITTED, State.SUBMITTED, "r", "proxy", None, "2026-01-01")
            raise RuntimeError("rolled back")
        store.record_outcome(forwarded, State.SUCCEEDED, reason="answered", http_status=201)
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
        assert heard == [forwarded, forwarded]  # the insert's and the outcome's; nothing of the rollback
        assert [n.payload for n in listener.notifies(timeout=0.5)] == []
    finally:
        listener.close()
        store.close()


def test_a_write_of_an_unknown_receipt_takes_the_whole_stores_lock(pg_url):
    # Its intent's lock cannot be known (no row): it waits for, and excludes, every writer instead.
    store = PostgresStore.open(pg_url, lock_timeout=0.3)
    blocker = psycopg.connect(pg_url, autocommit=True)
    try:
        blocker.execute("BEGIN")
        blocker.execute("SELECT pg_advisory_xact_lock_shared(%s)", (0x5EC1E7,))  # a writer of some intent
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            store.transition("20260101T000000Z-nosuchreceipt", State.NOT_SENT, reason="r")
        blocker.execute("ROLLBACK")
        with pytest.raises(UnknownReceipt):
            store.transition("20260101T000000Z-nosuchreceipt", State.NOT_SENT, reason="r")
    finally:
        blocker.close()
        store.close()

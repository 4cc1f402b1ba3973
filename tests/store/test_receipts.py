"""
The receipts store: opening, begin_attempt decisions, transitions, append-only history,
recovery, concurrency (threads; processes in tests/e2e/store/test_processes.py), and failing
closed when it cannot write.

Every test that takes `store` or `db` runs on both backends: SQLite, and PostgreSQL (a fresh
schema on the session's throwaway server, tests/pg.py; skipped with one line when there is
none). The tests of SQLite's own files, pragmas and locks take `db_path` and stay SQLite's.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from proxy_addon.errors import IllegalTransition, StoreError, StoreUnavailable, UnknownReceipt
from proxy_addon.states import UNRESOLVED, State
from proxy_addon.store import Attempt, Decision, ReceiptStore, RecordedResponse, Store, iso, open_store
from tests.conftest import T0, FakeClock

JOIN_TIMEOUT = 15.0


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "receipts.db"


@pytest.fixture
def db(backend_db) -> str:
    """The receipts database of one test, on each backend (tests/conftest.py)."""
    return backend_db


@pytest.fixture
def store(backend_store):
    return backend_store


def sql(store, statement: str, params=()):
    """Run raw SQL on a store's own connection, as a tool outside the proxy would (`?` placeholders)."""
    return (
        store._rows(statement, params)
        if statement.lstrip().upper().startswith("SELECT")
        else store._execute(statement, params)
    )


def in_transaction(store) -> bool:
    conn = store.conn
    if isinstance(store, Store):
        return conn.in_transaction
    import psycopg

    return conn is not None and not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def attempt(fp: str = "fp-1", *, flow_id: str | None = "flow-1", instance: str | None = "inst-1", **kw) -> Attempt:
    fields: dict[str, Any] = dict(
        api="example",
        operation="articles.create",
        method="POST",
        target="https://api.example/articles",
        intent_fingerprint=fp,
        intent={"title": "hello", "tags": ["a", "b"]},
        principal="agent-1",
        flow_id=flow_id,
        instance=instance,
    )
    fields.update(kw)
    return Attempt(**fields)


RESPONSE = RecordedResponse(
    status=201,
    headers=[("Content-Type", "application/json"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")],
    body=b'{"id": 42}\x00\xff',
)


def n_receipts(store) -> int:
    return sql(store, "SELECT count(*) AS n FROM receipts")[0]["n"]


def n_events(store) -> int:
    return sql(store, "SELECT count(*) AS n FROM receipt_events")[0]["n"]


def forward(store: ReceiptStore, fp: str = "fp-1", **kw) -> str:
    d = store.begin_attempt(attempt(fp, **kw))
    assert d.kind == "forward"
    return d.receipt.operation_id


def walk(store: ReceiptStore, op: str, *states: State) -> None:
    for s in states:
        store.transition(op, s, reason=f"to {s}", actor="setup")


# Legal paths from submitted, for putting a receipt into a given state.
PATH = {
    State.SUBMITTED: (),
    State.SUCCEEDED: (State.SUCCEEDED,),
    State.REJECTED: (State.REJECTED,),
    State.NOT_SENT: (State.NOT_SENT,),
    State.OUTCOME_UNKNOWN: (State.OUTCOME_UNKNOWN,),
    State.RECONCILING: (State.OUTCOME_UNKNOWN, State.RECONCILING),
    State.MANUAL_REVIEW: (State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW),
    State.SAFE_TO_RETRY: (State.OUTCOME_UNKNOWN, State.RECONCILING, State.SAFE_TO_RETRY),
}


def test_open_creates_private_file_and_directory(tmp_path, clock):
    old = os.umask(0o022)
    try:
        path = tmp_path / "newdir" / "receipts.db"
        s = Store.open(path, clock=clock)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        # The WAL holds the same data as the database: it must be as private.
        forward(s)
        wal = Path(f"{path}-wal")
        assert wal.exists()
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600
        assert s.path == str(path)
    finally:
        s.close()


def test_open_sets_wal_and_synchronous_full(db_path, clock):
    s = Store.open(db_path, clock=clock, lock_timeout=1.5)
    try:
        assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert s.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert s.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1500
    finally:
        s.close()


def test_migrations_recorded_and_not_reapplied(db_path, clock):
    s = Store.open(db_path, clock=clock)
    rows = s.conn.execute("SELECT migration_set, name, applied_at FROM _sqlite_migrations").fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("receipt-proxy", "m001_receipts"),
        ("receipt-proxy", "m002_prunable_events_and_idempotency_keys"),
        ("receipt-proxy", "m003_awaiting_approval_is_unresolved"),
        ("receipt-proxy", "m004_when_an_idempotency_key_was_first_sent"),
        ("receipt-proxy", "m005_raw_target"),
        ("receipt-proxy", "m006_failed_reads"),
        ("receipt-proxy", "m007_approval_decisions"),
        ("receipt-proxy", "m008_instance_leases"),
        ("receipt-proxy", "m009_fingerprint_versions"),
        ("receipt-proxy", "m010_request_lifetime"),
        ("receipt-proxy", "m011_key_check_and_sealed_answers"),
        ("receipt-proxy", "m012_read_principal"),
        ("receipt-proxy", "m013_interim_answers"),
        ("receipt-proxy", "m014_approval_links"),
        ("receipt-proxy", "m015_shadow_receipts"),
        ("receipt-proxy", "m016_budget_charges"),
        ("receipt-proxy", "m017_hash_chain"),
        ("receipt-proxy", "m018_trace_parent"),
    ]
    forward(s)
    s.close()

    s2 = Store.open(db_path, clock=clock)  # would fail with "table receipts already exists" if re-run
    try:
        rows2 = s2.conn.execute("SELECT migration_set, name, applied_at FROM _sqlite_migrations").fetchall()
        assert rows2 == rows
        assert n_receipts(s2) == 1
    finally:
        s2.close()


def test_schema_unique_index_covers_exactly_unresolved(store):
    if isinstance(store, Store):
        text = sql(store, "SELECT sql FROM sqlite_master WHERE name = 'receipts_one_unresolved_per_fingerprint'")
        index = text[0]["sql"]
    else:
        index = sql(
            store,
            "SELECT indexdef FROM pg_indexes WHERE indexname = "
            "'receipts_one_unresolved_per_fingerprint' AND schemaname = current_schema()",
        )[0]["indexdef"]
    assert "UNIQUE" in index
    for s in State:
        assert (f"'{s}'" in index) == (s in UNRESOLVED), s


def test_open_without_create_refuses_missing_file(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no receipts database"):
        Store.open(path, create=False)
    assert not path.exists()


def test_open_without_create_refuses_a_file_that_is_not_a_receipts_db(tmp_path):
    path = tmp_path / "other.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE notes (x)")
    other.commit()
    other.close()
    with pytest.raises(StoreError, match="is not a receipts database") as info:
        Store.open(path, create=False)
    assert not isinstance(info.value, StoreUnavailable)
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
        assert [r[0] for r in check.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["notes"]
    finally:
        check.close()


def test_concurrent_first_open_of_a_new_database(tmp_path):
    failures: list[str] = []
    for trial in range(5):
        path = tmp_path / f"fresh-{trial}.db"
        barrier = threading.Barrier(8, timeout=JOIN_TIMEOUT)

        def worker(barrier: threading.Barrier, path: Path) -> None:  # bound per trial, not the loop's latest
            barrier.wait()
            try:
                Store.open(path).close()
            except StoreError as e:
                failures.append(str(e))

        threads = [threading.Thread(target=worker, args=(barrier, path)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_new_attempt_is_forwarded_with_a_submitted_receipt(store, clock):
    a = attempt(flow_id="flow-7", instance="inst-9")
    d = store.begin_attempt(a, actor="proxy-1")
    assert d.kind == "forward"
    r = d.receipt
    assert r.state is State.SUBMITTED
    assert r.unresolved
    assert (r.api, r.operation, r.method, r.target) == (a.api, a.operation, a.method, a.target)
    assert (r.intent_fingerprint, r.intent, r.principal) == ("fp-1", a.intent, "agent-1")
    assert (r.flow_id, r.instance, r.retry_of) == ("flow-7", "inst-9", None)
    assert r.submitted_at == r.updated_at == iso(T0) == "2026-03-01T12:00:00.000000Z"
    assert r.completed_at is None and r.response is None and r.http_status is None
    assert r.operation_id.startswith("20260301T120000Z-")
    assert store.get(r.operation_id) == r
    [ev] = store.events(r.operation_id)
    assert (ev.event, ev.from_state, ev.to_state) == ("transition", None, State.SUBMITTED)
    assert (ev.reason, ev.actor, ev.flow_id, ev.at) == ("new attempt", "proxy-1", "flow-7", iso(T0))
    assert n_receipts(store) == 1


@pytest.mark.parametrize("state", sorted(UNRESOLVED - {State.AWAITING_APPROVAL}), ids=str)
def test_duplicate_while_unresolved_is_blocked(store, clock, state):
    op = forward(store)
    walk(store, op, *PATH[state])
    before = store.get(op)
    events_before = len(store.events(op))
    clock.advance(10)

    d = store.begin_attempt(attempt(flow_id="flow-dup"), actor="proxy-2")

    assert d.kind == "blocked"
    assert d.receipt == before
    assert n_receipts(store) == 1
    assert store.get(op) == before  # blocking does not touch the receipt
    events = store.events(op)
    assert len(events) == events_before + 1
    ev = events[-1]
    assert (ev.event, ev.from_state, ev.to_state) == ("blocked", state, state)
    assert ev.reason == "duplicate blocked: the first attempt is unresolved"
    assert (ev.actor, ev.flow_id, ev.at) == ("proxy-2", "flow-dup", iso(clock.now))


def test_blocked_repeatedly_records_each_duplicate(store):
    op = forward(store)
    kinds = [store.begin_attempt(attempt(flow_id=f"dup-{i}")).kind for i in range(3)]
    assert kinds == ["blocked"] * 3
    assert [e.flow_id for e in store.events(op) if e.event == "blocked"] == ["dup-0", "dup-1", "dup-2"]
    assert n_receipts(store) == 1


def succeed(store: ReceiptStore, clock: FakeClock, response: RecordedResponse | None = RESPONSE) -> str:
    op = forward(store)
    clock.advance(1)
    store.transition(op, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=response)
    return op


def test_after_success_replay_within_window(store, clock):
    op = succeed(store, clock)
    clock.advance(59)
    d = store.begin_attempt(attempt(flow_id="flow-dup"), replay_window=60)
    assert d.kind == "replay"
    assert d.receipt.operation_id == op
    assert d.answer == RESPONSE  # opened from its seal for this replay
    assert d.receipt.response.encryption == "v1" and b'"id": 42' not in d.receipt.response.sealed
    assert n_receipts(store) == 1
    ev = store.events(op)[-1]
    assert (ev.event, ev.from_state, ev.to_state) == ("replayed", State.SUCCEEDED, State.SUCCEEDED)
    assert ev.reason == "duplicate answered with the recorded response"
    assert ev.flow_id == "flow-dup"


def test_after_success_replay_at_exact_window_edge(store, clock):
    op = succeed(store, clock)
    clock.advance(60)
    d = store.begin_attempt(attempt(), replay_window=60)
    assert (d.kind, d.receipt.operation_id) == ("replay", op)


def test_after_success_replay_window_elapsed_forwards_a_retry(store, clock):
    op = succeed(store, clock)
    clock.advance(61)
    d = store.begin_attempt(attempt(), replay_window=60)
    assert d.kind == "forward"
    assert d.receipt.operation_id != op
    assert d.receipt.retry_of == op
    assert d.receipt.state is State.SUBMITTED
    assert store.get(op).state is State.SUCCEEDED
    assert n_receipts(store) == 2
    [ev] = store.events(d.receipt.operation_id)
    assert ev.reason == f"new attempt, retry of {op}"
    # and the new attempt is itself unresolved: the next duplicate is blocked on it
    d2 = store.begin_attempt(attempt(), replay_window=60)
    assert (d2.kind, d2.receipt.operation_id) == ("blocked", d.receipt.operation_id)


def test_after_success_block(store, clock):
    op = succeed(store, clock)
    d = store.begin_attempt(attempt(), after_success="block")
    assert (d.kind, d.receipt.operation_id) == ("blocked_succeeded", op)
    assert n_receipts(store) == 1
    ev = store.events(op)[-1]
    assert (ev.event, ev.from_state, ev.to_state) == ("blocked", State.SUCCEEDED, State.SUCCEEDED)
    assert ev.reason == "duplicate blocked: the operation already succeeded"


def test_after_success_allow_forwards_a_retry(store, clock):
    op = succeed(store, clock)
    d = store.begin_attempt(attempt(), after_success="allow")
    assert d.kind == "forward"
    assert d.receipt.retry_of == op
    assert n_receipts(store) == 2


@pytest.mark.parametrize(
    "response",
    [RecordedResponse(status=201, headers=[], body=b'{"id"', truncated=True), None],
    ids=["truncated-response", "no-response"],
)
def test_after_success_without_complete_response_is_blocked(store, clock, response):
    op = succeed(store, clock, response=response)
    d = store.begin_attempt(attempt(), after_success="replay", replay_window=60)
    assert (d.kind, d.receipt.operation_id, d.answer) == ("blocked_succeeded", op, None)
    ev = store.events(op)[-1]
    assert ev.event == "blocked"
    assert ev.reason == (
        "duplicate blocked: succeeded, no answer recorded"  # a rule's `record: false`
        if response is None
        else "duplicate blocked: succeeded, and no complete response was recorded to replay"
    )
    assert n_receipts(store) == 1


@pytest.mark.parametrize("state", [State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY], ids=str)
def test_after_retryable_state_forwards_a_retry(store, clock, state):
    op = forward(store)
    walk(store, op, *PATH[state])
    clock.advance(3)
    d = store.begin_attempt(attempt(flow_id="flow-retry"))
    assert d.kind == "forward"
    assert d.receipt.retry_of == op
    assert d.receipt.state is State.SUBMITTED
    assert d.receipt.flow_id == "flow-retry"
    assert store.get(op).state is state
    assert n_receipts(store) == 2
    # a chain: the latest receipt is the one a further retry points at
    walk(store, d.receipt.operation_id, State.REJECTED)
    d2 = store.begin_attempt(attempt())
    assert (d2.kind, d2.receipt.retry_of) == ("forward", d.receipt.operation_id)


def test_different_fingerprints_never_interact(store, clock):
    a = forward(store, "fp-a")
    b = forward(store, "fp-b")  # not blocked by a's unresolved receipt
    assert store.get(b).retry_of is None

    d = store.begin_attempt(attempt("fp-a"))
    assert (d.kind, d.receipt.operation_id) == ("blocked", a)
    assert [e.event for e in store.events(b)] == ["transition"]  # b got no blocked event

    store.transition(a, State.SUCCEEDED, reason="ok", response=RESPONSE)
    d = store.begin_attempt(attempt("fp-b"))
    assert (d.kind, d.receipt.operation_id) == ("blocked", b)  # a's success does not free b

    store.transition(b, State.REJECTED, reason="400")
    d = store.begin_attempt(attempt("fp-c"))
    assert (d.kind, d.receipt.retry_of) == ("forward", None)
    d = store.begin_attempt(attempt("fp-a"))
    assert (d.kind, d.receipt.operation_id) == ("replay", a)
    assert store.counts() == {"succeeded": 1, "rejected": 1, "submitted": 1}


def test_expect_guard_lost_race_from_submitted(db, clock):
    s1 = open_store(db, clock=clock)
    s2 = open_store(db, clock=clock)  # another connection, as another thread/process would use
    try:
        op = forward(s1)
        s1.transition(op, State.SUCCEEDED, reason="HTTP 201", expect=[State.SUBMITTED])
        with pytest.raises(IllegalTransition, match=f"receipt {op} is succeeded"):
            s2.transition(op, State.OUTCOME_UNKNOWN, reason="proxy died", expect=[State.SUBMITTED])
        assert s2.get(op).state is State.SUCCEEDED
        assert [(e.from_state, e.to_state) for e in s2.events(op)] == [
            (None, State.SUBMITTED),
            (State.SUBMITTED, State.SUCCEEDED),
        ]
    finally:
        s1.close()
        s2.close()


def test_expect_guard_refuses_even_when_the_table_would_allow(store):
    op = forward(store)
    walk(store, op, State.OUTCOME_UNKNOWN, State.RECONCILING)
    store.transition(op, State.MANUAL_REVIEW, reason="reconciler A gave up")
    # reconciler B still believes it is reconciling; manual_review -> succeeded is legal, but B
    # expected reconciling, so it must not overwrite A's newer knowledge
    with pytest.raises(IllegalTransition):
        store.transition(op, State.SUCCEEDED, reason="reconciler B", expect=[State.RECONCILING])
    assert store.get(op).state is State.MANUAL_REVIEW
    # without the guard the same move is allowed
    assert store.transition(op, State.SUCCEEDED, reason="reviewed").state is State.SUCCEEDED


def test_expect_with_a_source_the_table_forbids(store):
    op = forward(store)
    n = n_events(store)
    with pytest.raises(IllegalTransition, match="not a legal transition"):
        store.transition(op, State.SUCCEEDED, reason="x", expect=[State.OUTCOME_UNKNOWN])
    assert store.get(op).state is State.SUBMITTED
    assert n_events(store) == n


def test_transition_to_submitted_is_refused(store):
    op = forward(store)
    walk(store, op, State.REJECTED)
    with pytest.raises(IllegalTransition, match="rejected → submitted is not allowed"):
        store.transition(op, State.SUBMITTED, reason="x")
    assert store.get(op).state is State.REJECTED


def test_unknown_receipt(store):
    forward(store)
    n = n_events(store)
    with pytest.raises(UnknownReceipt, match="no receipt nope"):
        store.transition("nope", State.SUCCEEDED, reason="x")
    with pytest.raises(UnknownReceipt):
        store.get("nope")
    assert issubclass(UnknownReceipt, LookupError)
    assert n_events(store) == n
    assert not in_transaction(store)


def test_unknown_field_is_a_type_error(store):
    op = forward(store)
    before = store.get(op)
    with pytest.raises(TypeError, match="cannot set state_note"):
        store.transition(op, State.SUCCEEDED, reason="x", state_note="hi")
    with pytest.raises(TypeError, match="cannot set"):
        store.transition(op, State.SUCCEEDED, reason="x", state=State.REJECTED)
    assert store.get(op) == before
    assert len(store.events(op)) == 1


@pytest.mark.parametrize(
    "response",
    [
        RESPONSE,
        RecordedResponse(status=204, headers=[], body=b""),
        RecordedResponse(status=200, headers=[("X-A", "1")], body=bytes(range(256)) * 4, truncated=True),
    ],
    ids=["json-with-repeated-headers", "empty", "binary-truncated"],
)
def test_response_round_trips(db, clock, response):
    s = open_store(db, clock=clock)
    op = forward(s)
    r = s.transition(
        op, State.SUCCEEDED, reason="HTTP", http_status=response.status, external_id="ext-42", response=response
    )
    assert s.answer_seal is not None and r.response is not None
    assert s.answer_seal.open(op, r.response) == response
    s.close()
    s2 = open_store(db, clock=clock)  # from disk, through a fresh connection
    try:
        stored = s2.get(op).response
        assert stored is not None and s2.answer_seal is not None
        assert (stored.status, stored.truncated, stored.encryption, stored.clear) == (
            response.status,
            response.truncated,
            "v1",
            None,
        )
        got = s2.answer_seal.open(op, stored)
        assert got == response
        assert isinstance(got.body, bytes)
        assert all(isinstance(h, tuple) for h in got.headers)
        assert got.truncated is response.truncated
        assert (s2.get(op).http_status, s2.get(op).external_id) == (response.status, "ext-42")
    finally:
        s2.close()


def test_completed_at_set_when_leaving_submitted_only(store, clock):
    op = forward(store)
    assert store.get(op).completed_at is None
    t1 = clock.advance(2)
    r = store.transition(op, State.OUTCOME_UNKNOWN, reason="timeout", error="read timeout")
    assert r.completed_at == iso(t1)
    assert r.error == "read timeout"
    t2 = clock.advance(30)
    r = store.transition(op, State.RECONCILING, reason="reconcile")
    assert r.completed_at == iso(t1)  # unchanged once set
    assert r.updated_at == iso(t2)
    assert r.submitted_at == iso(T0)


def test_explicit_completed_at_wins(store, clock):
    op = forward(store)
    clock.advance(2)
    r = store.transition(op, State.SUCCEEDED, reason="ok", completed_at="2026-03-01T12:00:01.000000Z")
    assert r.completed_at == "2026-03-01T12:00:01.000000Z"
    assert r.updated_at == iso(clock.now)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE receipt_events SET reason = 'rewritten'",
        "UPDATE receipt_events SET to_state = 'succeeded' WHERE id = 1",
        "DELETE FROM receipt_events",
        "DELETE FROM receipt_events WHERE id = 1",
    ],
    ids=["update-all", "update-one", "delete-all", "delete-one"],
)
def test_receipt_events_is_append_only(store, statement):
    op = forward(store)
    store.transition(op, State.SUCCEEDED, reason="ok")
    before = store.events(op)
    with pytest.raises(StoreError, match="append-only"), store._write():
        globals()["sql"](store, statement)
    assert store.events(op) == before
    assert len(before) == 2


def test_unknown_stored_state_is_a_store_error(store):
    op = forward(store)
    sql(store, "UPDATE receipts SET state = 'bogus' WHERE operation_id = ?", (op,))
    with pytest.raises(StoreError, match=f"receipt {op} has unknown state 'bogus'") as info:
        store.get(op)
    assert not isinstance(info.value, UnknownReceipt)
    with pytest.raises(StoreError, match="bogus"):
        store.list()
    # a duplicate of it fails closed (no forward) and writes nothing
    n, e = n_receipts(store), n_events(store)
    with pytest.raises(StoreError, match="bogus"):
        store.begin_attempt(attempt())
    assert (n_receipts(store), n_events(store)) == (n, e)
    assert not in_transaction(store)


def test_list_and_counts(store, clock):
    ops = []
    for i in range(4):
        clock.advance(1)
        ops.append(forward(store, f"fp-{i}"))
    walk(store, ops[0], State.SUCCEEDED)
    walk(store, ops[1], State.REJECTED)
    assert [r.operation_id for r in store.list()] == ops[::-1]
    assert [r.operation_id for r in store.list(limit=2)] == [ops[3], ops[2]]
    assert [r.operation_id for r in store.list(states=[State.SUCCEEDED, State.REJECTED])] == [ops[1], ops[0]]
    assert store.list(states=[State.MANUAL_REVIEW]) == []
    assert store.counts() == {"submitted": 2, "succeeded": 1, "rejected": 1}


def test_recover_in_flight(store, clock):
    dead = forward(store, "fp-dead", instance="dead-1")
    alive = forward(store, "fp-alive", instance="alive-1")
    nobody = forward(store, "fp-none", instance=None)
    recon_dead = forward(store, "fp-recon", instance="dead-1")
    walk(store, recon_dead, State.OUTCOME_UNKNOWN, State.RECONCILING)
    done = forward(store, "fp-done", instance="dead-1")
    walk(store, done, State.SUCCEEDED)
    review = forward(store, "fp-review", instance="dead-1")
    walk(store, review, State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW)
    untouched = {op: store.get(op) for op in (alive, done, review)}
    calls: list[str | None] = []

    def is_alive(instance):
        calls.append(instance)
        return instance == "alive-1"

    t = clock.advance(100)
    recovered = store.recover_in_flight(is_alive=is_alive, actor="recovery")

    assert sorted(recovered) == sorted([dead, nobody, recon_dead])
    assert sorted(calls, key=str) == sorted(["dead-1", "alive-1", None, "dead-1"], key=str)
    for op in (dead, nobody):
        r = store.get(op)
        assert r.state is State.OUTCOME_UNKNOWN
        assert r.error == "proxy stopped while the request was in flight"
        assert r.completed_at is None and r.updated_at == iso(t)  # nobody saw its attempt end
        ev = store.events(op)[-1]
        assert (ev.event, ev.from_state, ev.to_state) == ("transition", State.SUBMITTED, State.OUTCOME_UNKNOWN)
        assert (ev.reason, ev.actor) == ("proxy stopped while the request was in flight", "recovery")
    r = store.get(recon_dead)
    assert r.state is State.OUTCOME_UNKNOWN
    assert store.events(recon_dead)[-1].reason == "proxy stopped while reconciling"
    for op, before in untouched.items():
        assert store.get(op) == before
    # a second pass finds nothing more to do
    assert store.recover_in_flight(is_alive=is_alive) == []


def test_a_receipt_records_how_long_its_request_may_be_in_flight(store, clock):
    """in_flight_until: when it became submitted plus the sending proxy's upstream timeout (m010); a held write
    gets it when it is approved, counted from then."""
    sent = store.begin_attempt(attempt("fp-life", upstream_timeout=30)).receipt
    assert (sent.upstream_timeout, sent.in_flight_until) == (30, iso(T0 + dt.timedelta(seconds=30)))
    assert store.get(sent.operation_id).in_flight_until == sent.in_flight_until  # as stored
    held = store.begin_attempt(attempt("fp-held", upstream_timeout=30, approval=True)).receipt
    assert (held.state, held.in_flight_until) == (State.AWAITING_APPROVAL, None)
    t = clock.advance(600)  # approved ten minutes later: sent from then
    approved = store.transition(held.operation_id, State.SUBMITTED, reason="approved", expect=[State.AWAITING_APPROVAL])
    assert approved.in_flight_until == iso(t + dt.timedelta(seconds=30)) == store.get(held.operation_id).in_flight_until
    unknown = store.begin_attempt(attempt("fp-old")).receipt  # an attempt that names no timeout
    assert (unknown.upstream_timeout, unknown.in_flight_until) == (None, None)


def test_threads_racing_on_one_fingerprint_forward_once(db):
    open_store(db).close()  # create and migrate first
    n = 8
    barrier = threading.Barrier(n, timeout=JOIN_TIMEOUT)
    kinds: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        s = open_store(db)
        try:
            barrier.wait()
            d = s.begin_attempt(attempt("fp-race", flow_id=f"t{i}"))
            with lock:
                kinds.append(d.kind)
        except BaseException as e:
            with lock:
                errors.append(e)
        finally:
            s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(kinds) == ["blocked"] * (n - 1) + ["forward"]
    s = open_store(db)
    try:
        assert n_receipts(s) == 1
        [r] = s.list()
        assert [e.event for e in s.events(r.operation_id)] == ["transition"] + ["blocked"] * (n - 1)
    finally:
        s.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes; see the mode=ro test")
def test_read_only_file_is_unavailable(db_path, clock):
    Store.open(db_path, clock=clock).close()
    os.chmod(db_path, 0o400)
    try:
        s = Store.open(db_path, clock=clock, create=False)  # sqlite falls back to read-only
        try:
            with pytest.raises(StoreUnavailable, match="readonly"):
                s.begin_attempt(attempt())
            assert not s.conn.in_transaction
        finally:
            s.close()
    finally:
        os.chmod(db_path, 0o600)
    s = Store.open(db_path, clock=clock)
    try:
        assert (n_receipts(s), n_events(s)) == (0, 0)
    finally:
        s.close()


def test_read_only_connection_is_unavailable(db_path, clock):
    store = Store.open(db_path, clock=clock)
    op = forward(store, "fp-existing")
    ro = Store(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None), clock=clock)
    try:
        assert ro.get(op).state is State.SUBMITTED  # it can read...
        with pytest.raises(StoreUnavailable, match="readonly"):
            ro.begin_attempt(attempt("fp-new"))
        with pytest.raises(StoreUnavailable):
            ro.transition(op, State.SUCCEEDED, reason="ok")
        assert not ro.conn.in_transaction
    finally:
        ro.close()
    assert n_receipts(store) == 1
    assert store.get(op).state is State.SUBMITTED
    assert len(store.events(op)) == 1
    store.close()


def test_locked_database_is_unavailable_and_nothing_is_written(db_path, clock):
    s = Store.open(db_path, clock=clock, lock_timeout=0.2)
    op = forward(s, "fp-existing")
    blocker = sqlite3.connect(db_path, isolation_level=None, timeout=0)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="locked"):
            s.begin_attempt(attempt("fp-new"))
        waited = time.monotonic() - started
        assert 0.15 <= waited < 3.0
        with pytest.raises(StoreUnavailable, match="locked"):
            s.transition(op, State.SUCCEEDED, reason="ok")
        assert not s.conn.in_transaction
        blocker.execute("ROLLBACK")

        assert n_receipts(s) == 1
        assert s.get(op).state is State.SUBMITTED
        assert len(s.events(op)) == 1
        # and the store works again once the lock is gone
        d = s.begin_attempt(attempt("fp-new"))
        assert (d.kind, d.receipt.retry_of) == ("forward", None)
    finally:
        blocker.close()
        s.close()


def test_after_success_without_response_forwards_once_the_window_passed(store, clock):
    op = succeed(store, clock, response=None)
    clock.advance(61)
    d = store.begin_attempt(attempt(), after_success="replay", replay_window=60)
    assert (d.kind, d.receipt.retry_of) == ("forward", op)


def test_unknown_after_success_is_refused(store):
    with pytest.raises(ValueError, match="after_success"):
        store.begin_attempt(attempt(), after_success="replya")
    assert n_receipts(store) == 0


def test_duplicate_counts(store, clock):
    op = forward(store)
    assert store.begin_attempt(attempt()).kind == "blocked"
    assert store.begin_attempt(attempt()).kind == "blocked"
    assert store.duplicate_counts([op, "missing"]) == {
        op: {"blocked": 2, "replayed": 0},
        "missing": {"blocked": 0, "replayed": 0},
    }
    assert store.duplicate_counts([]) == {}


def test_an_attempt_awaiting_approval_blocks_duplicates_and_settles(store, clock):
    d = store.begin_attempt(
        Attempt(
            api="a",
            operation="o",
            method="POST",
            target="https://x/y",
            intent_fingerprint="fp-approve",
            intent={},
            principal="p",
            approval=True,
        )
    )
    assert (d.kind, d.receipt.state) == ("forward", State.AWAITING_APPROVAL)
    dup = store.begin_attempt(
        Attempt(
            api="a",
            operation="o",
            method="POST",
            target="https://x/y",
            intent_fingerprint="fp-approve",
            intent={},
            principal="p",
        )
    )
    assert (dup.kind, dup.receipt.operation_id) == ("blocked", d.receipt.operation_id)
    store.transition(d.receipt.operation_id, State.SUBMITTED, reason="approved by operator", actor="mitmweb")
    assert store.get(d.receipt.operation_id).state is State.SUBMITTED


def test_a_success_settled_after_the_answer_is_never_replayed(db):
    """A 5xx recorded, then found by a read (or resolved by hand): a duplicate is blocked, not
    answered with the 5xx as if it were the success."""
    store = open_store(db)
    a = Attempt(
        api="x",
        operation="create",
        method="POST",
        target="https://x.test/a",
        intent_fingerprint="sha256:settled",
        intent={},
        principal="anonymous",
    )
    r = store.begin_attempt(a).receipt
    store.transition(
        r.operation_id,
        State.OUTCOME_UNKNOWN,
        reason="HTTP 502",
        http_status=502,
        response=RecordedResponse(status=502, headers=[], body=b'{"message": "Server Error"}'),
    )
    store.claim_for_reconcile(r.operation_id, actor="test")
    store.transition(r.operation_id, State.SUCCEEDED, reason="found by a read", external_id="7")
    d = store.begin_attempt(a)
    assert (d.kind, d.receipt.operation_id) == ("blocked_succeeded", r.operation_id)
    b = Attempt(**{**a.__dict__, "intent_fingerprint": "sha256:answered"})
    r2 = store.begin_attempt(b).receipt
    store.transition(
        r2.operation_id,
        State.SUCCEEDED,
        reason="HTTP 201",
        http_status=201,
        response=RecordedResponse(status=201, headers=[], body=b'{"id": 8}'),
    )
    assert store.begin_attempt(b).kind == "replay"
    assert store.begin_attempt(b).kind == "replay"  # and again: a replay's own event changes nothing
    store.close()


def test_a_reused_idempotency_key_keeps_the_time_it_was_first_sent(db):
    """A retry after safe_to_retry reuses its predecessor's key; the key's age (which an API's
    ttl counts) runs from the first receipt that sent it, not from the retry."""
    clock = FakeClock()
    store = open_store(db, clock=clock)
    a = Attempt(
        api="x",
        operation="pay",
        method="POST",
        target="https://x.test/pay",
        intent_fingerprint="sha256:keyed",
        intent={},
        principal="anonymous",
        idempotency=True,
    )
    first = store.begin_attempt(a).receipt
    assert first.idempotency_key_at == first.submitted_at
    store.transition(first.operation_id, State.OUTCOME_UNKNOWN, reason="dropped")
    store.claim_for_reconcile(first.operation_id, actor="t")
    store.transition(first.operation_id, State.SAFE_TO_RETRY, reason="the key dedupes")
    clock.advance(7200)
    second = store.begin_attempt(a).receipt
    assert (second.retry_of, second.idempotency_key) == (first.operation_id, first.idempotency_key)
    assert second.idempotency_key_at == first.submitted_at != second.submitted_at
    store.transition(second.operation_id, State.REJECTED, reason="declined")
    third = store.begin_attempt(a).receipt  # after a rejection: a new key, a new clock
    assert third.idempotency_key != first.idempotency_key and third.idempotency_key_at == third.submitted_at
    store.close()


def commits(s: Store) -> list[tuple[str, str]]:
    """Trace a SQLite store's connection: each COMMIT as (its synchronous level, what it wrote)."""
    level = "FULL"
    statements: list[str] = []
    out: list[tuple[str, str]] = []

    def trace(statement: str) -> None:
        nonlocal level, statements
        st = " ".join(statement.split())
        if st.upper().startswith("PRAGMA SYNCHRONOUS="):
            level = st.split("=", 1)[1].upper()
        elif st == "BEGIN IMMEDIATE":
            statements = []
        elif st == "COMMIT":
            wrote = [
                w
                for w in ("INSERT INTO receipts ", "UPDATE receipts ", "INSERT INTO receipt_events ")
                if any(x.startswith(w) for x in statements)
            ]
            out.append((level, ",".join(w.split()[-1] if w.startswith("INSERT") else "update" for w in wrote)))
        else:
            statements.append(st)

    s.conn.set_trace_callback(trace)
    return out


def test_only_outcomes_and_duplicates_commit_without_fsync(db_path, clock):
    """
    A new receipt commits with synchronous=FULL (the promise); a forwarded write's outcome and
    a duplicate's event with NORMAL; everything else FULL. A guess of "duplicate" that turns
    out a new receipt (a success past its replay window) is decided again and committed FULL.
    """
    s = Store.open(db_path, clock=clock)
    try:
        seen = commits(s)
        op = forward(s)
        s.record_outcome(op, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=RESPONSE)
        assert s.begin_attempt(attempt(flow_id="dup"), replay_window=60).kind == "replay"
        clock.advance(61)
        retry = s.begin_attempt(attempt(flow_id="retry"), replay_window=60)
        assert retry.kind == "forward"
        assert s.begin_attempt(attempt(flow_id="dup-2")).kind == "blocked"
        s.record_outcome(retry.receipt.operation_id, State.OUTCOME_UNKNOWN, reason="connection reset")
        s.resolve(retry.receipt.operation_id, State.SUCCEEDED, note="seen in the dashboard", actor="ops")
        assert seen == [
            ("FULL", "receipts,receipt_events"),  # the new receipt
            ("NORMAL", "update,receipt_events"),  # its outcome
            ("NORMAL", "receipt_events"),  # the replayed duplicate
            ("FULL", "receipts,receipt_events"),  # the retry after the window (guessed a duplicate first)
            ("NORMAL", "receipt_events"),  # the blocked duplicate
            ("NORMAL", "update,receipt_events"),  # the retry's outcome
            ("FULL", "update,receipt_events"),  # a person's resolution
        ]
        assert [e.event for e in s.events(op)] == ["transition", "transition", "replayed"]
    finally:
        s.close()


def durability_setting(store) -> str:
    """What the database says commits of the open transaction wait for: FULL/NORMAL (SQLite), on/off (PostgreSQL)."""
    if isinstance(store, Store):
        return {2: "FULL", 1: "NORMAL"}[store.conn.execute("PRAGMA synchronous").fetchone()[0]]
    return sql(store, "SELECT current_setting('synchronous_commit') AS v")[0]["v"]


def test_a_transaction_that_need_not_be_durable_says_so_to_the_database(store):
    durable, relaxed = ("FULL", "NORMAL") if isinstance(store, Store) else ("on", "off")
    op = forward(store)
    with store._write(durable=False):
        assert durability_setting(store) == relaxed
        sql(store, "UPDATE receipts SET error = 'x' WHERE operation_id = ?", (op,))
    with store._write():
        assert durability_setting(store) == durable
        store._relax()  # PostgreSQL: off from here to the commit; SQLite cannot change inside a transaction
        assert durability_setting(store) == (relaxed if store.relaxes_late else durable)
    with store._write():
        assert durability_setting(store) == durable  # SET LOCAL ended with its transaction
    assert store.get(op).error == "x"


def test_each_event_is_written_as_durably_as_promised(store):
    """On both backends: a new receipt durably; its outcome and a duplicate's event not; a person's decision durably."""
    durable, relaxed = ("FULL", "NORMAL") if isinstance(store, Store) else ("on", "off")
    seen = []

    base = type(store)

    def _event(self, operation_id, event, *args, **kw):
        seen.append((event, durability_setting(self)))
        base._event(self, operation_id, event, *args, **kw)

    # the same store, telling what the database says as each event is written (a subclass of the backend's class)
    store.__class__ = type("Watched", (base,), {"_event": _event})
    op = forward(store)
    store.record_outcome(op, State.OUTCOME_UNKNOWN, reason="connection reset")
    assert store.begin_attempt(attempt(flow_id="dup")).kind == "blocked"
    store.resolve(op, State.SAFE_TO_RETRY, note="not in the dashboard", actor="ops")
    assert store.begin_attempt(attempt(flow_id="retry")).kind == "forward"
    assert seen == [
        ("transition", durable),  # submitted
        ("transition", relaxed),  # outcome_unknown
        ("blocked", relaxed),
        ("transition", durable),  # manual_review
        ("transition", durable),  # safe_to_retry
        ("transition", durable),  # the retry, submitted
    ]


def test_an_unresolved_receipt_that_is_not_its_intents_latest_still_blocks(store):
    """
    `begin_attempt` reads an intent's unresolved receipt first, whatever was inserted after it: one
    observe mode sent beside it (`shadow_of`, resolved first), or a database edited by hand into an
    older unresolved receipt under a newer resolved one. The duplicate is blocked by it; nothing else
    is written.
    """
    older = forward(store)
    newer = forward(store, "fp-2")
    store.transition(newer, State.REJECTED, reason="HTTP 400")
    sql(store, "UPDATE receipts SET intent_fingerprint = 'fp-1' WHERE operation_id = ?", (newer,))
    n, e = n_receipts(store), n_events(store)
    d = store.begin_attempt(attempt())
    assert (d.kind, d.receipt.operation_id) == ("blocked", older)
    assert (n_receipts(store), n_events(store)) == (n, e + 1)  # its blocked event
    assert store.get(older).state is State.SUBMITTED
    assert not in_transaction(store)


def test_transitions_after_lists_the_state_changes_after_an_event(store):
    """What mitmweb's watch follows (mitm/watch.py): each state change by its event's id, on both backends."""
    assert store.last_event_id() == 0 and store.transitions_after(0) == []
    first = store.begin_attempt(attempt("fp-a")).receipt
    mark = store.last_event_id()
    second = store.begin_attempt(attempt("fp-b", flow_id="flow-2")).receipt
    store.record_outcome(first.operation_id, State.SUCCEEDED, reason="upstream answered HTTP 201")
    assert store.begin_attempt(attempt("fp-b", flow_id="flow-3")).kind == "blocked"  # an event, no state change
    changes = store.transitions_after(mark)
    assert [op for _, op in changes] == [second.operation_id, first.operation_id]
    ids = [i for i, _ in changes]
    assert ids == sorted(ids) and ids[0] > mark and store.last_event_id() > ids[-1]  # the blocked event came last
    assert store.transitions_after(ids[-1]) == []
    assert store.transitions_after(0, limit=1) == [(mark, first.operation_id)]


def _unknown(path: Path) -> tuple[Store, str]:
    """A store with one outcome_unknown receipt for attempt(): (the store, its operation id)."""
    store = Store.open(path)
    first = store.begin_attempt(attempt()).receipt
    store.record_outcome(first.operation_id, State.OUTCOME_UNKNOWN, reason="the connection dropped")
    return store, first.operation_id


def _loop_connection(path: Path, clock=None) -> Store:
    return Store.open(path, lock_timeout=0, create=False, checkpoints=False, **({"clock": clock} if clock else {}))


def test_answer_duplicate_answers_from_one_read_and_records_the_answer(db_path):
    store, op_id = _unknown(db_path)
    local = _loop_connection(db_path)
    try:
        decision = local.answer_duplicate(attempt(flow_id="flow-2"))
        assert decision != "busy" and decision != "new"
        assert isinstance(decision, Decision)
        assert (decision.kind, decision.receipt.operation_id) == ("blocked", op_id)
        blocked = [e for e in store.events(op_id) if e.event == "blocked"]  # committed: another connection sees it
        assert [(e.flow_id, e.to_state) for e in blocked] == [("flow-2", State.OUTCOME_UNKNOWN)]
        before = len(store.events(op_id))
        assert local.answer_duplicate(attempt("fp-new")) == "new"  # a new receipt is the store thread's, durably
        # Straight to the transaction (a likely retry, loop_connection.py): the same decisions.
        assert local.answer_duplicate(attempt("fp-new"), look_first=False) == "new"
        assert [r.intent_fingerprint for r in store.list(limit=None)] == ["fp-1"]
        assert len(store.events(op_id)) == before
        assert not local.conn.in_transaction
        again = local.answer_duplicate(attempt(flow_id="flow-3"), look_first=False)
        assert again not in ("new", "busy")
        assert isinstance(again, Decision) and (again.kind, again.receipt.operation_id) == ("blocked", op_id)
        assert [e.flow_id for e in store.events(op_id) if e.event == "blocked"] == ["flow-2", "flow-3"]
    finally:
        local.close()
        store.close()


def test_answer_duplicate_does_not_wait_for_another_writer(db_path):
    store, op_id = _unknown(db_path)
    local = _loop_connection(db_path)
    other = Store.open(db_path, create=False)
    other.conn.execute("BEGIN IMMEDIATE")  # another process writing
    try:
        started = time.monotonic()
        assert local.answer_duplicate(attempt()) == "busy"
        assert time.monotonic() - started < 0.5
        assert not local.conn.in_transaction
    finally:
        other.conn.execute("ROLLBACK")
        other.close()
    try:
        assert [e.event for e in store.events(op_id) if e.event != "transition"] == []  # nothing written
        assert local.answer_duplicate(attempt()) != "busy"  # the lock is free again
    finally:
        local.close()
        store.close()


def test_answer_duplicate_never_answers_from_a_read_another_writer_made_stale(db_path):
    """
    Another process settles the receipt between answer_duplicate's read and its write (the
    clock is read there): the read is stale, so nothing is written and it says "busy"; the
    store's begin_attempt then decides on what was committed (a retry, not a 409).
    """
    store, op_id = _unknown(db_path)
    other = Store.open(db_path, create=False)
    reads = []

    def clock():
        reads.append(1)
        if len(reads) == 2:  # after the read of the receipt, before the duplicate's event
            other.resolve(op_id, State.SAFE_TO_RETRY, note="checked by hand: it never arrived", actor="ops")
        return T0

    local = _loop_connection(db_path, clock)
    try:
        assert local.answer_duplicate(attempt()) == "busy"
        assert not local.conn.in_transaction
        assert [e.event for e in store.events(op_id) if e.event in ("blocked", "replayed")] == []
        decision = store.begin_attempt(attempt())
        assert (decision.kind, decision.receipt.retry_of) == ("forward", op_id)
    finally:
        local.close()
        other.close()
        store.close()


def test_a_replay_costs_the_same_after_many_replays(db_path):
    """
    Deciding a replay reads how the receipt became succeeded: looked for from the receipt's first
    event, not its last, or each replay would scan every replay before it. Counted in SQLite's
    virtual machine steps (deterministic), after 20 and after 2000 replays.
    """
    store = Store.open(db_path)
    first = store.begin_attempt(attempt()).receipt
    store.record_outcome(first.operation_id, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=RESPONSE)

    def steps_of_one_replay() -> int:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        store.conn.set_progress_handler(count, 1)
        try:
            assert store.begin_attempt(attempt()).kind == "replay"
        finally:
            store.conn.set_progress_handler(None, 1)
        return steps[0]

    for _ in range(20):
        store.begin_attempt(attempt())
    few = steps_of_one_replay()
    for _ in range(2000):
        store.begin_attempt(attempt())
    many = steps_of_one_replay()
    store.close()
    assert many < 2 * few, f"a replay took {few} steps after 20 replays and {many} after 2000"


def test_enforcement_since_counts_what_was_done_and_what_observe_mode_would_have_done(store, clock):
    """`receipts report`'s read (cli/enforcement_report.py), on both backends: per api and operation."""
    from proxy_addon.store import iso
    from proxy_addon.store.records import Charge

    old = forward(store, "fp-old")  # before the window: not counted
    walk(store, old, State.OUTCOME_UNKNOWN)
    assert store.begin_attempt(attempt("fp-old")).kind == "blocked"
    clock.advance(3600)
    since = iso(clock())
    first = forward(store)
    walk(store, first, State.OUTCOME_UNKNOWN)
    assert store.begin_attempt(attempt()).kind == "blocked"  # done: blocked
    shadow = store.begin_attempt(attempt(observe=True)).receipt  # observe: would_block
    held = store.begin_attempt(attempt("fp-2", approval=True)).receipt  # done: held
    denied = store.begin_attempt(attempt("fp-3", denied="decisions[0]: deny")).receipt  # done: denied
    assert [e.event for e in store.events(denied.operation_id)] == ["transition"]  # no "blocked" event of its own
    store.begin_attempt(attempt("fp-4", observe=True, denied="decisions[0]: deny"))  # observe: would_deny
    store.begin_attempt(attempt("fp-5", operation="other", observe=True, approval=True))  # observe: would_hold
    over = Charge("example/articles.create/budget[0]/3600s/count", 2, 3600, 1, "budget[0]: 1 writes per 1h", "")
    refused = store.begin_attempt(attempt("fp-6", charges=(over,)))  # done: refused over its budget
    assert refused.kind == "over_budget"
    seen = store.enforcement_since(since, examples=1)
    assert seen.writes == {("example", "articles.create"): 6, ("example", "other"): 1}
    assert seen.counts == {
        ("example", "articles.create", "blocked"): 1,
        ("example", "articles.create", "would_block"): 1,
        ("example", "articles.create", "held"): 1,
        ("example", "articles.create", "denied"): 1,
        ("example", "articles.create", "would_deny"): 1,
        ("example", "articles.create", "refused"): 1,  # before: counted as denied
        ("example", "other", "would_hold"): 1,
    }
    examples = {(api, op, kind): x.operation_id for api, op, kind, x in seen.examples}
    assert examples[("example", "articles.create", "blocked")] == first
    assert examples[("example", "articles.create", "would_block")] == shadow.operation_id
    assert examples[("example", "articles.create", "held")] == held.operation_id
    assert examples[("example", "articles.create", "denied")] == denied.operation_id
    assert examples[("example", "articles.create", "refused")] == refused.receipt.operation_id
    assert len(seen.examples) == 7

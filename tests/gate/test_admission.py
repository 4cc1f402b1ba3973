"""
The gate (proxy_addon/gate/admission.py) driven directly, without mitmproxy: a real store on its own
thread, attempts built from a rules file, and the real upstream of tests/upstream.py, which
counts the writes it saw and the reads a reconcile sent. Writes the gate forwards are sent
here with httpx, once, as the exchange would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from proxy_addon.errors import StoreError
from proxy_addon.gate.admission import Admitted, Gate, GateSettings
from proxy_addon.gate.loop_connection import LOCAL_CHECKPOINT
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.intent.fingerprint import RequestView, build_attempt
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.classify import Outcome, answer_outcome, failure_outcome
from proxy_addon.reconcile.http_reads import ReadSettings
from proxy_addon.rules import Operation, RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Attempt, Event, Receipt, ReceiptStore, Store
from tests.conftest import FakeClock, deadline
from tests.upstream import Upstream

RULES = """
api: gate-test
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    description: a read can settle an unknown outcome; a 409 says it may already exist
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
    classify: [{status: 409, state: already_exists, reason: the thing may already exist}]
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/things"}
      find: {title: "{intent.title}"}
      absence_provable: true
      retry_when_absent: true
      external_id: id
  plain.create:
    description: no read; an unknown outcome stays blocked
    match: {method: POST, path: "/api/{bucket}/plain"}
    fingerprint: {body: [title]}
    external_id: id
"""
KEY = b"k" * 32
CREDENTIAL = "gate-test-credential"
CREDENTIALS = {"api-key": CREDENTIAL}


@dataclass
class World:
    """The rules, the store file and the gates of one test, over the shared upstream and the test's bucket."""

    upstream: Upstream
    bucket: str
    tmp_path: Path
    rules: RuleSet = field(default_factory=lambda: RuleSet.of([load_rules(RULES, "gate-test.yaml")]))
    clock: FakeClock = field(default_factory=FakeClock)
    threads: list[StoreThread] = field(default_factory=list)
    local: bool = False  # gates with the event loop's own connection, as the proxy's on SQLite
    locals_: list[Store] = field(default_factory=list)

    @property
    def db(self):
        return self.tmp_path / "r.db"

    def gate(self, **settings) -> Gate:
        """
        A gate over its own store connection (two gates: two proxy processes on one database),
        and, when `local`, the event loop's connection that never waits (mitm/receipts_db.py opens it).
        """
        store = Store.open(self.db, clock=self.clock)
        calls = StoreThread(store)
        self.threads.append(calls)
        local = None
        if self.local:
            local = Store.open(
                self.db, clock=self.clock, lock_timeout=0, create=False, checkpoints=False, writes_with=store
            )
            self.locals_.append(local)
        return Gate(calls, GateSettings(reads=ReadSettings(timeout=5), **settings), local=local)

    def path(self, kind: str = "things") -> str:
        return f"/api/{self.bucket}/{kind}"

    def url(self, kind: str = "things") -> str:
        return f"{self.upstream.url}{self.path(kind)}"

    def attempt(self, kind: str = "things", title: str = "hello") -> tuple[Attempt, Operation]:
        p = self.path(kind)
        match = self.rules.match("127.0.0.1", self.upstream.port, "POST", p)
        assert match is not None
        view = RequestView(
            "POST",
            "http",
            "127.0.0.1",
            self.upstream.port,
            p,
            {"content-type": "application/json", "api-key": CREDENTIAL},
            json.dumps({"title": title}).encode(),
        )
        return build_attempt(match, view, KEY), match.operation

    async def send(self, op: Operation, kind: str = "things", title: str = "hello") -> Outcome:
        """Send a forwarded write once and classify what happened, as the exchange does."""
        async with httpx.AsyncClient(timeout=5) as client:
            try:
                r = await client.post(self.url(kind), json={"title": title}, headers=CREDENTIALS)
            except httpx.HTTPError as e:
                return failure_outcome(e)
        headers = {k.lower(): v for k, v in r.headers.items()}
        recorded = answers.recorded(r.status_code, r.headers.multi_items(), r.content, 65536)
        return answer_outcome(r.status_code, r.reason_phrase, headers, r.content, op, recorded)

    def store(self) -> Store:
        """Another connection to the database, to look at what the gate committed."""
        return Store.open(self.db, clock=self.clock, create=False)

    def events(self, operation_id: str) -> list[Event]:
        s = self.store()
        try:
            return s.events(operation_id)
        finally:
            s.close()

    def receipts(self) -> list[Receipt]:
        s = self.store()
        try:
            return s.list(limit=None)
        finally:
            s.close()


def transitions(events: list[Event]) -> list[tuple[str | None, str]]:
    return [(e.from_state and str(e.from_state), str(e.to_state)) for e in events if e.event == "transition"]


def duplicates(events: list[Event]) -> list[tuple[str, str]]:
    """The answers duplicates got, as recorded: (event, the receipt's state when it was answered)."""
    return [(e.event, str(e.to_state)) for e in events if e.event != "transition"]


@pytest.fixture(params=["store thread", "event loop"])
def world(request, tmp_path, upstream, bucket) -> Iterator[World]:
    """Each test twice: duplicates and outcomes decided on the store's thread only, or first on the event loop."""
    w = World(upstream, bucket, tmp_path, local=request.param == "event loop")
    yield w
    for calls in w.threads:
        calls.close()
    for local in w.locals_:
        local.close()


async def forward_through(
    gate: Gate, w: World, attempt: Attempt, op: Operation, kind: str = "things", title: str = "hello"
) -> tuple[Admitted, Receipt | None]:
    """What the proxy does with a matched write: admit; if forwarded, send once and record."""
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    if admitted.decision.kind != "forward":
        return admitted, None
    outcome = await w.send(op, kind, title)
    return admitted, await gate.record(admitted.decision.receipt.operation_id, outcome, op=op, credentials=CREDENTIALS)


async def unknown_receipt(w: World, gate: Gate, fault: str, kind: str = "things") -> Receipt:
    """A write the upstream breaks with `fault` after reading it: its outcome_unknown receipt."""
    w.upstream.plan(w.path(kind), fault)
    attempt, op = w.attempt(kind)
    admitted, receipt = await forward_through(gate, w, attempt, op, kind)
    assert admitted.decision.kind == "forward"
    assert receipt is not None and receipt.state is State.OUTCOME_UNKNOWN
    assert w.upstream.seen(w.path(kind)) == 1
    return receipt


# --- a new attempt -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "state", "http_status", "external_id"),
    [
        ("ok", State.SUCCEEDED, 201, "1"),
        ("400", State.REJECTED, 400, None),
        ("500", State.OUTCOME_UNKNOWN, 500, None),
        ("drop", State.OUTCOME_UNKNOWN, None, None),
    ],
)
async def test_a_new_attempt_is_forwarded_and_its_outcome_recorded(world, fault, state, http_status, external_id):
    gate = world.gate()
    world.upstream.plan(world.path(), fault)
    attempt, op = world.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    assert admitted.decision.kind == "forward"
    assert admitted.attempt == attempt
    first = admitted.decision.receipt
    (stored,) = world.receipts()  # committed before admit returned
    assert (stored.operation_id, stored.state) == (first.operation_id, State.SUBMITTED)
    assert world.upstream.seen(world.path()) == 0

    outcome = await world.send(op)
    assert outcome.state is state
    receipt = await gate.record(first.operation_id, outcome, flow_id="flow-1")
    assert receipt is not None
    assert (receipt.state, receipt.http_status, receipt.external_id) == (state, http_status, external_id)
    assert receipt.completed_at is not None
    assert world.upstream.seen(world.path()) == 1
    events = world.events(first.operation_id)
    assert transitions(events) == [(None, "submitted"), ("submitted", str(state))]
    assert events[-1].flow_id == "flow-1"
    assert duplicates(events) == []


async def test_record_only_moves_a_submitted_receipt(world, caplog):
    """A second outcome for the same receipt is refused: the first one stays."""
    gate = world.gate()
    attempt, op = world.attempt()
    _, receipt = await forward_through(gate, world, attempt, op)
    assert receipt is not None and receipt.state is State.SUCCEEDED
    again = await gate.record(receipt.operation_id, Outcome(State.OUTCOME_UNKNOWN, "late reset"))
    assert again is None
    assert "could not record" in caplog.text
    (stored,) = world.receipts()
    assert stored.state is State.SUCCEEDED
    assert transitions(world.events(receipt.operation_id)) == [(None, "submitted"), ("submitted", "succeeded")]


# --- a duplicate of a request in flight ---------------------------------------------------------


@pytest.mark.parametrize("where", ["this process", "another process"])
async def test_a_duplicate_waits_for_the_original_and_gets_the_replay(world, where):
    gate = world.gate(wait_submitted=60)
    other = gate if where == "this process" else world.gate(wait_submitted=60)  # polls the store
    attempt, op = world.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    original = admitted.decision.receipt

    started = time.monotonic()
    duplicate = asyncio.create_task(other.admit(world.attempt()[0], op, CREDENTIALS))
    await asyncio.sleep(0.5)
    assert not duplicate.done(), "the duplicate did not wait for the original's outcome"

    receipt = await gate.record(original.operation_id, await world.send(op))
    recorded_at = time.monotonic()
    assert receipt is not None and receipt.state is State.SUCCEEDED
    dup = await asyncio.wait_for(duplicate, 90)
    finished = time.monotonic()

    assert dup.decision.kind == "replay"
    assert dup.decision.receipt.operation_id == original.operation_id
    assert answers.replay(dup.decision.receipt, dup.decision.answer).status == 201
    assert finished - started >= 0.5
    # Woken by the outcome (at once, or at the next look of the store): not at the end of its 60 s wait.
    assert finished - recorded_at < 15, "the duplicate was not woken by the outcome"
    assert world.upstream.seen(world.path()) == 1
    events = world.events(original.operation_id)
    assert duplicates(events) == [("replayed", "succeeded")]  # the final answer only: no "blocked" first
    assert len(world.receipts()) == 1


async def test_a_duplicate_still_in_flight_after_the_wait_is_blocked(world):
    gate = world.gate(wait_submitted=0.5)
    attempt, op = world.attempt()
    original = (await gate.admit(attempt, op, CREDENTIALS)).decision.receipt
    started = time.monotonic()
    dup = await gate.admit(world.attempt()[0], op, CREDENTIALS)
    waited = time.monotonic() - started
    assert dup.decision.kind == "blocked"
    assert (dup.decision.receipt.operation_id, dup.decision.receipt.state) == (original.operation_id, State.SUBMITTED)
    assert 0.5 <= waited < deadline(5)  # 0.5 s on a quiet machine
    assert world.upstream.seen(world.path()) == 0
    assert duplicates(world.events(original.operation_id)) == [("blocked", "submitted")]
    assert len(world.receipts()) == 1


# --- a duplicate of an unknown outcome ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "kind", "settled", "external_id"),
    [
        ("drop", "blocked_succeeded", State.SUCCEEDED, "1"),  # committed, then dropped: the read finds it
        ("lost", "forward", State.SAFE_TO_RETRY, None),  # never committed: absence is proven
    ],
)
async def test_a_duplicate_of_an_unknown_outcome_reconciles_it(world, fault, kind, settled, external_id):
    gate = world.gate()
    first = await unknown_receipt(world, gate, fault)
    attempt, op = world.attempt()
    dup = await gate.admit(attempt, op, CREDENTIALS)

    assert dup.decision.kind == kind
    assert world.upstream.reads(world.path()) == 1
    assert world.upstream.seen(world.path()) == 1  # no extra write
    (read,) = [r for r in world.upstream.requests if r["method"] == "GET" and r["path"] == world.path()]
    assert read["headers"]["api-key"] == CREDENTIAL  # the duplicate's own credentials
    after = {r.operation_id: r for r in world.receipts()}
    assert (after[first.operation_id].state, after[first.operation_id].external_id) == (settled, external_id)
    events = world.events(first.operation_id)
    assert transitions(events) == [
        (None, "submitted"),
        ("submitted", "outcome_unknown"),
        ("outcome_unknown", "reconciling"),
        ("reconciling", str(settled)),
    ]
    if kind == "forward":
        retry = dup.decision.receipt
        assert (retry.state, retry.retry_of) == (State.SUBMITTED, first.operation_id)
        assert set(after) == {first.operation_id, retry.operation_id}
        assert duplicates(events) == []  # a forwarded retry is a new receipt, not a duplicate's answer
    else:
        assert dup.decision.receipt.operation_id == first.operation_id
        assert len(after) == 1
        assert duplicates(events) == [("blocked", "succeeded")]  # one event: the answer after the read


async def test_a_duplicate_of_an_unknown_outcome_without_a_read_is_blocked_at_once(world):
    gate = world.gate()
    first = await unknown_receipt(world, gate, "drop", kind="plain")
    attempt, op = world.attempt("plain")
    dup = await gate.admit(attempt, op, CREDENTIALS)
    assert dup.decision.kind == "blocked"
    assert dup.decision.receipt.state is State.OUTCOME_UNKNOWN
    assert world.upstream.reads(world.path("plain")) == 0
    assert world.upstream.seen(world.path("plain")) == 1
    assert duplicates(world.events(first.operation_id)) == [("blocked", "outcome_unknown")]


async def test_concurrent_duplicates_share_one_read(world):
    gate = world.gate()
    first = await unknown_receipt(world, gate, "drop")
    _, op = world.attempt()
    results = await asyncio.gather(*[gate.admit(world.attempt()[0], op, CREDENTIALS) for _ in range(5)])
    assert world.upstream.reads(world.path()) == 1
    assert world.upstream.seen(world.path()) == 1
    assert [r.decision.kind for r in results] == ["blocked_succeeded"] * 5
    (after,) = world.receipts()
    assert (after.operation_id, after.state, after.external_id) == (first.operation_id, State.SUCCEEDED, "1")
    events = world.events(first.operation_id)
    assert transitions(events).count(("outcome_unknown", "reconciling")) == 1
    assert duplicates(events) == [("blocked", "succeeded")] * 5  # one per duplicate


# --- an answer that says it may already exist ------------------------------------------------------


@pytest.mark.parametrize(
    ("exists", "settled", "external_id"),
    [
        (True, State.SUCCEEDED, "1"),
        (False, State.SAFE_TO_RETRY, None),
    ],
)
async def test_evidence_is_reconciled_at_once(world, exists, settled, external_id):
    gate = world.gate()
    if exists:  # made earlier, by another client: the API answers 409 to this one
        httpx.post(world.url(), json={"title": "hello"}, headers=CREDENTIALS, timeout=5).raise_for_status()
    world.upstream.plan(world.path(), "409")
    attempt, op = world.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    assert admitted.decision.kind == "forward"
    outcome = await world.send(op)
    assert (outcome.state, outcome.evidence, outcome.http_status) == (State.OUTCOME_UNKNOWN, True, 409)

    receipt = await gate.record(admitted.decision.receipt.operation_id, outcome, op=op, credentials=CREDENTIALS)
    assert receipt is not None
    assert (receipt.state, receipt.external_id) == (settled, external_id)
    assert world.upstream.reads(world.path()) == 1  # read before record returned
    assert world.upstream.seen(world.path()) == (2 if exists else 1)
    (stored,) = world.receipts()
    assert stored.state is settled
    assert transitions(world.events(receipt.operation_id)) == [
        (None, "submitted"),
        ("submitted", "outcome_unknown"),
        ("outcome_unknown", "reconciling"),
        ("reconciling", str(settled)),
    ]


async def test_evidence_without_the_operation_is_left_unknown(world):
    """Without `op`, record cannot read: the receipt stays outcome_unknown for a duplicate or the CLI."""
    gate = world.gate()
    world.upstream.plan(world.path(), "409")
    attempt, op = world.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    receipt = await gate.record(admitted.decision.receipt.operation_id, await world.send(op))
    assert receipt is not None and receipt.state is State.OUTCOME_UNKNOWN
    assert world.upstream.reads(world.path()) == 0


# --- the store refusing --------------------------------------------------------------------------


def sqlite_conn(store: ReceiptStore) -> sqlite3.Connection:
    assert isinstance(store, Store), "these tests refuse writes on SQLite"
    return store.conn


def refuse(gate: Gate, how: str) -> None:
    """Make the store refuse every write: on its own thread, and on the event loop's connection if any."""
    if how == "closed":
        gate.calls.wait(lambda s: sqlite_conn(s).close())
        if gate.local is not None:
            sqlite_conn(gate.local).close()
    else:
        gate.calls.wait(lambda s: sqlite_conn(s).execute("PRAGMA query_only = ON"))
        if gate.local is not None:
            sqlite_conn(gate.local).execute("PRAGMA query_only = ON")


@pytest.mark.parametrize("how", ["closed", "read-only"])
async def test_admit_raises_when_the_store_refuses_and_nothing_is_forwarded(world, how):
    gate = world.gate()
    refuse(gate, how)
    attempt, op = world.attempt()
    with pytest.raises(StoreError):
        await forward_through(gate, world, attempt, op)
    assert world.upstream.seen(world.path()) == 0
    assert world.receipts() == []


@pytest.mark.parametrize("how", ["closed", "read-only"])
async def test_record_returns_none_and_logs_when_the_store_refuses(world, how, caplog):
    gate = world.gate()
    attempt, op = world.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    operation_id = admitted.decision.receipt.operation_id
    outcome = await world.send(op)
    refuse(gate, how)
    with caplog.at_level(logging.ERROR, logger="proxy_addon.gate.admission"):
        assert await gate.record(operation_id, outcome) is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "proxy_addon.gate.admission"]
    assert len(errors) == 1
    assert operation_id in errors[0].getMessage() and "could not record" in errors[0].getMessage()
    (stored,) = world.receipts()
    assert (stored.operation_id, stored.state) == (operation_id, State.SUBMITTED)  # recovered at restart
    assert world.upstream.seen(world.path()) == 1


# --- the event loop's connection (SQLite) ---------------------------------------------------------


@pytest.fixture
def local_world(tmp_path, upstream, bucket) -> Iterator[World]:
    w = World(upstream, bucket, tmp_path, local=True)
    yield w
    for calls in w.threads:
        calls.close()
    for local in w.locals_:
        local.close()


@contextlib.contextmanager
def store_thread_held(gate: Gate) -> Iterator[None]:
    """The store's thread busy with a call that ends only when the block does (a slow fsync, a long prune)."""
    entered, release = threading.Event(), threading.Event()

    def hold(store):
        entered.set()
        release.wait(10)

    gate.calls._submit(hold, lambda result, error: None)  # not awaited (it returns nothing): it holds the thread
    assert entered.wait(5)
    try:
        yield
    finally:
        release.set()


async def test_a_duplicate_is_answered_on_the_event_loop_while_the_store_thread_is_busy(local_world):
    """One read and its event on the event loop's connection: no hand-off, so a busy store thread does not delay it."""
    w = local_world
    gate = w.gate()
    receipt = await unknown_receipt(w, gate, "drop", kind="plain")  # no read: a duplicate is blocked at once
    attempt, op = w.attempt("plain")
    with store_thread_held(gate):
        dup = await asyncio.wait_for(gate.admit(attempt, op, CREDENTIALS), 2)
        assert dup.decision.kind == "blocked"
        assert dup.decision.receipt.operation_id == receipt.operation_id
        # committed (not waiting for the disk) before the answer: another connection sees it now
        assert duplicates(w.events(receipt.operation_id)) == [("blocked", "outcome_unknown")]
    assert w.upstream.seen(w.path("plain")) == 1
    assert len(w.receipts()) == 1


async def test_an_outcome_is_recorded_on_the_event_loop_when_the_store_thread_is_idle(local_world):
    """
    No hand-off for the outcome while the store's thread has nothing to run: the event loop's
    connection records it (here the store thread's own connection could not have: read-only).
    """
    w = local_world
    gate = w.gate()
    attempt, op = w.attempt()
    admitted = await gate.admit(attempt, op, CREDENTIALS)
    assert admitted.decision.kind == "forward"  # a new receipt: durably, on the store's thread
    outcome = await w.send(op)
    gate.calls.wait(lambda s: s.conn.execute("PRAGMA query_only = ON"))
    receipt = await gate.record(admitted.decision.receipt.operation_id, outcome)
    assert receipt is not None and receipt.state is State.SUCCEEDED
    (stored,) = w.receipts()
    assert (stored.state, stored.http_status) == (State.SUCCEEDED, 201)
    assert transitions(w.events(stored.operation_id)) == [(None, "submitted"), ("submitted", "succeeded")]


async def test_the_event_loop_never_waits_for_another_writer(local_world):
    """
    Another process holds the write lock: the event loop's connection does not wait for it (the
    loop keeps running), the store's thread waits in its place, and then decides as always.
    """
    w = local_world
    gate = w.gate()
    receipt = await unknown_receipt(w, gate, "drop", kind="plain")
    attempt, op = w.attempt("plain")
    other = w.store()
    other.conn.execute("BEGIN IMMEDIATE")
    try:
        dup = asyncio.create_task(gate.admit(attempt, op, CREDENTIALS))
        ticks = 0
        started = time.monotonic()
        while time.monotonic() - started < 0.5:
            await asyncio.sleep(0.01)
            ticks += 1
        # About 45 on a quiet machine; a loop held by the lock ticks once, when the wait is over.
        assert ticks >= 5, "the event loop was held while another process held the write lock"
        assert not dup.done()  # the store's thread waits for the lock (lock_timeout)
    finally:
        other.conn.execute("ROLLBACK")
        other.close()
    decided = await asyncio.wait_for(dup, 5)
    assert (decided.decision.kind, decided.decision.receipt.operation_id) == ("blocked", receipt.operation_id)
    assert duplicates(w.events(receipt.operation_id)) == [("blocked", "outcome_unknown")]


async def test_the_event_loops_commits_keep_the_wal_bounded(local_world):
    """The event loop's connection never checkpoints: the gate has the store's thread do it, so duplicates alone
    (no new receipt) do not grow the WAL without bound."""
    w = local_world
    gate = w.gate()
    receipt = await unknown_receipt(w, gate, "drop", kind="plain")
    attempt, op = w.attempt("plain")
    wal = w.tmp_path / "r.db-wal"
    sizes = []
    for i in range(6 * LOCAL_CHECKPOINT):
        assert (await gate.admit(attempt, op, CREDENTIALS)).decision.kind == "blocked"
        if i % LOCAL_CHECKPOINT == LOCAL_CHECKPOINT - 1:
            # The gate does not wait for the checkpoint it gave the store's thread; the test does, however
            # busy the machine (a call queued after it runs after it), so the sizes do not depend on timing.
            await asyncio.sleep(0)  # the checkpoint's task hands it to the store's thread
            await gate.calls(lambda s: None)
            sizes.append(wal.stat().st_size)
    assert len([e for e in w.events(receipt.operation_id) if e.event == "blocked"]) == 6 * LOCAL_CHECKPOINT
    assert max(sizes) < 1.5 * sizes[0], f"the WAL kept growing: {sizes}"  # without the checkpoints: 6× the first


# --- the store's thread --------------------------------------------------------------------------


async def test_the_store_thread_runs_calls_in_order_and_survives_failures_and_cancellations(tmp_path):
    """One hand-off each way (store_thread.StoreThread): order kept, exceptions returned, a cancelled caller
    harmless."""
    calls = StoreThread(Store.open(tmp_path / "receipts.db"))
    thread_names = set()
    seen: list[int] = []

    def step(i: int):
        def run(store):
            thread_names.add(threading.current_thread().name)
            if i == 3:
                raise StoreError("the third call fails")
            time.sleep(0.05 if i == 5 else 0)
            seen.append(i)
            return i

        return run

    results = await asyncio.gather(*(calls(step(i)) for i in range(5)), return_exceptions=True)
    assert results[:3] == [0, 1, 2] and isinstance(results[3], StoreError) and results[4] == 4
    slow = asyncio.ensure_future(calls(step(5)))
    await asyncio.sleep(0.01)
    slow.cancel()  # the caller gave up: the call still runs, and the thread goes on
    assert await calls(step(6)) == 6
    assert seen == [0, 1, 2, 4, 5, 6]
    assert calls.wait(lambda s: s.list()) == []
    assert len(thread_names) == 1  # one thread, never the event loop's
    calls.close(wait=True)
    with pytest.raises(RuntimeError, match="closed"):
        await calls(step(7))
    with pytest.raises(StoreError):  # closed on its own thread, after the calls before it
        calls.store.list()


# --- an MCP call's task (store/rounds.py, outcome/task_ends.py) -------------------------------------------


async def test_a_task_that_cannot_be_read_waits_until_its_time_to_live_then_is_unknown(world):
    """
    The proxy reads a task itself when a duplicate comes (here its URL answers no JSON-RPC: the read
    fails). Before the task's ttl the receipt waits on and the duplicate is refused with the task's
    id; past it, its server may have discarded it: outcome_unknown, and nothing is ever sent again.
    """
    from proxy_addon.store import Interim
    from proxy_addon.store.sealing import AnswerSeal

    w = world
    gate = w.gate(wait_submitted=30)
    for store in (gate.calls.store, *w.locals_):
        store.answer_seal = AnswerSeal(KEY)
    attempt, op = w.attempt("plain")
    first = await gate.admit(attempt, op, CREDENTIALS)
    assert first.decision.kind == "forward"
    task = Interim(
        "task", "a task", task_id="task-1234567890", task_status="working", task_revision="2026-07-28", task_ttl=60
    )
    waiting = await gate.record(first.decision.receipt.operation_id, Outcome(State.SUBMITTED, "a task", interim=task))
    assert waiting is not None and (waiting.waiting_for, waiting.task_hint) == ("task", "task-123…")

    again = await gate.admit(w.attempt("plain")[0], op, CREDENTIALS)  # read: fails; refused with the id, at once
    assert again.decision.kind == "blocked" and again.decision.task_id == "task-1234567890"
    assert again.decision.receipt.state is State.SUBMITTED
    w.clock.advance(61)
    late = await gate.admit(w.attempt("plain")[0], op, CREDENTIALS)
    assert late.decision.kind == "blocked" and late.decision.receipt.state is State.OUTCOME_UNKNOWN
    assert "past its time to live" in (late.decision.receipt.error or "")
    assert w.upstream.seen(w.path("plain")) == 2  # the two reads (POSTs of tasks/get); the write was never sent
    assert duplicates(w.events(waiting.operation_id)) == [
        ("task", "submitted"),
        ("blocked", "submitted"),
        ("blocked", "outcome_unknown"),
    ]


async def test_a_duplicate_waiting_in_another_process_is_answered_once_the_call_waits_for_input(world):
    """
    Gate B (another proxy on the same store) holds a duplicate while A's call is in flight; A's answer
    is input_required: B's duplicate is answered then, not after receipts_wait_submitted (60 s here).
    """
    from proxy_addon.store import Interim

    w = world
    a, b = w.gate(wait_submitted=60), w.gate(wait_submitted=60)
    attempt, op = w.attempt("plain")
    first = await a.admit(attempt, op, CREDENTIALS)
    waiting = asyncio.ensure_future(b.admit(w.attempt("plain")[0], op, CREDENTIALS))
    await asyncio.sleep(0.3)  # B is waiting for the outcome
    assert not waiting.done()
    asked = Outcome(State.SUBMITTED, "asked", interim=Interim("input_required", "the server asked for input"))
    await a.record(first.decision.receipt.operation_id, asked)
    answered = await asyncio.wait_for(waiting, 20)  # generous; without the interim's wake-up it takes 60 s
    assert answered.decision.kind == "blocked" and answered.decision.receipt.waiting_for == "input"
    assert duplicates(w.events(first.decision.receipt.operation_id)) == [
        ("input_required", "submitted"),
        ("blocked", "submitted"),
    ]

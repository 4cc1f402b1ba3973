"""
The state machine: the TRANSITIONS table itself, and the store obeying it.

Every legal (source, target) pair from TRANSITIONS must go through `Store.transition`
and leave exactly one new `receipt_events` row; every other State x State pair must raise
IllegalTransition and leave the receipt and its history untouched. A receipt is put into
an arbitrary source state by walking a legal path from `submitted` (found by BFS over the
table, so the test follows the table if the table changes).
"""

from __future__ import annotations

import collections
import itertools

import pytest

from proxy_addon.errors import IllegalTransition, StoreError
from proxy_addon.states import RETRYABLE, TRANSITIONS, UNRESOLVED, State, is_legal, sources_of
from proxy_addon.store import Attempt, Store, iso
from tests.conftest import FakeClock


def bfs_paths(start: State = State.SUBMITTED) -> dict[State, list[State]]:
    """Shortest legal path (list of states after `start`) from `start` to every reachable state."""
    paths: dict[State, list[State]] = {start: []}
    queue = collections.deque([start])
    while queue:
        here = queue.popleft()
        for nxt in sorted(TRANSITIONS[here]):  # sorted: deterministic paths
            if nxt not in paths:
                paths[nxt] = [*paths[here], nxt]
                queue.append(nxt)
    return paths


PATHS = bfs_paths()  # awaiting_approval is a first state too, not reached from submitted
LEGAL = sorted((s, t) for s, targets in TRANSITIONS.items() for t in targets)
ILLEGAL = sorted((s, t) for s, t in itertools.product(State, State) if t not in TRANSITIONS[s])
TERMINAL = sorted(s for s in State if not TRANSITIONS[s])


def pair_id(pair: tuple[State, State]) -> str:
    return f"{pair[0]}->{pair[1]}"


@pytest.fixture
def store(backend_store):
    """On each backend: one transition table, the same guards."""
    return backend_store


_fingerprints = itertools.count()


def receipt_in(store: Store, clock: FakeClock, state: State) -> str:
    """A new receipt (own fingerprint), walked legally from submitted to `state`; returns its id.
    An awaiting_approval receipt is created as one (its operation needs approval)."""
    n = next(_fingerprints)
    attempt = Attempt(
        api="example",
        operation="things.create",
        method="POST",
        target="https://api.example/things",
        intent_fingerprint=f"fp-{n}",
        intent={"n": n},
        principal="agent-1",
        flow_id=f"flow-{n}",
        instance="inst-1",
        approval=state is State.AWAITING_APPROVAL,
    )
    decision = store.begin_attempt(attempt)
    assert decision.kind == "forward"
    op = decision.receipt.operation_id
    for step in PATHS.get(state, []):
        clock.advance(1)
        store.transition(op, step, reason=f"walk to {state}", actor="setup")
    assert store.get(op).state is state
    return op


def event_count(store: Store) -> int:
    return store._rows("SELECT count(*) AS n FROM receipt_events")[0]["n"]


# --- the table itself --------------------------------------------------------------------


def test_table_has_a_row_for_every_state_and_only_states():
    assert set(TRANSITIONS) == set(State)
    for targets in TRANSITIONS.values():
        assert targets <= set(State)


def test_table_is_exactly_the_documented_one():
    # 17 legal transitions; a change to the table must change this test on purpose
    assert len(LEGAL) == 17
    assert len(ILLEGAL) == len(State) ** 2 - 17 == 64


def test_every_state_is_reachable_from_submitted_or_is_the_approval_gate():
    assert set(PATHS) == set(State) - {State.AWAITING_APPROVAL}


def test_only_an_approval_moves_to_submitted():
    assert sources_of(State.SUBMITTED) == frozenset({State.AWAITING_APPROVAL})
    assert sources_of(State.AWAITING_APPROVAL) == frozenset()


@pytest.mark.parametrize("state", TERMINAL, ids=str)
def test_terminal_states_have_no_exits(state):
    assert TRANSITIONS[state] == frozenset()
    assert not any(is_legal(state, t) for t in State)


def test_terminal_states_are_exactly_succeeded_and_the_retryable_ones():
    assert set(TERMINAL) == {State.SUCCEEDED, State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY}
    assert set(TERMINAL) == RETRYABLE | {State.SUCCEEDED}


def test_unresolved_is_exactly_the_five_open_states():
    assert (
        frozenset(
            {State.AWAITING_APPROVAL, State.SUBMITTED, State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW}
        )
        == UNRESOLVED
    )
    # ... which are exactly the states that still have exits
    assert frozenset(s for s in State if TRANSITIONS[s]) == UNRESOLVED


def test_retryable_is_exactly_rejected_not_sent_safe_to_retry():
    assert frozenset({State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY}) == RETRYABLE
    assert not (RETRYABLE & UNRESOLVED)


@pytest.mark.parametrize("target", sorted(State), ids=str)
def test_sources_of_inverts_the_table(target):
    expected = {s for s in State if target in TRANSITIONS[s]}
    assert sources_of(target) == expected


def test_sources_of_succeeded():
    assert sources_of(State.SUCCEEDED) == {State.SUBMITTED, State.RECONCILING, State.MANUAL_REVIEW}


# --- the store obeys the table ------------------------------------------------------------


@pytest.mark.parametrize("source,target", LEGAL, ids=[pair_id(p) for p in LEGAL])
@pytest.mark.parametrize("with_expect", [False, True], ids=["any-source", "expect-source"])
def test_legal_transition_succeeds_and_appends_one_event(store, clock, source, target, with_expect):
    op = receipt_in(store, clock, source)
    before = store.events(op)
    clock.advance(5)
    kwargs = {"expect": [source]} if with_expect else {}

    after = store.transition(op, target, reason=f"test {source}->{target}", actor="tester", flow_id="flow-x", **kwargs)

    assert after.state is target
    assert store.get(op).state is target
    assert after.updated_at == iso(clock.now)
    events = store.events(op)
    assert len(events) == len(before) + 1
    assert events[: len(before)] == before  # history untouched
    new = events[-1]
    assert (new.event, new.from_state, new.to_state) == ("transition", source, target)
    assert (new.reason, new.actor, new.flow_id) == (f"test {source}->{target}", "tester", "flow-x")
    assert new.at == iso(clock.now)
    assert new.operation_id == op


@pytest.mark.parametrize("source,target", ILLEGAL, ids=[pair_id(p) for p in ILLEGAL])
@pytest.mark.parametrize("with_expect", [False, True], ids=["any-source", "expect-source"])
def test_illegal_transition_raises_and_changes_nothing(store, clock, source, target, with_expect):
    op = receipt_in(store, clock, source)
    before = store.get(op)
    before_events = store.events(op)
    total_events = event_count(store)
    clock.advance(5)
    kwargs = {"expect": [source]} if with_expect else {}

    with pytest.raises(IllegalTransition) as info:
        store.transition(op, target, reason="should not happen", actor="tester", **kwargs)

    assert isinstance(info.value, StoreError)
    assert str(target) in str(info.value)
    assert store.get(op) == before  # state, updated_at, completed_at... all unchanged
    assert store.get(op).state is source
    assert store.events(op) == before_events
    assert event_count(store) == total_events
    # the failed write was rolled back, not left open
    assert not (store.conn.in_transaction if isinstance(store, Store) else store.conn.info.transaction_status)

"""
Effect budgets counted from receipts (store/budgets.py), on each backend, on a clock the tests move:
the window math, the plain decision (`over_budget`), and the counting in `begin_attempt`: a new
receipt takes its share, one refused over budget is recorded rejected and takes none, a receipt
that ends rejected or not_sent gives its share back (the kept use always equals a recount from the
receipts), and a duplicate takes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from proxy_addon.states import State
from proxy_addon.store import Attempt
from proxy_addon.store.budgets import over_budget, window_of
from proxy_addon.store.records import Charge
from tests.conftest import T0

HOUR = 3600
KEY = "pay/charge/budget[0]/3600s/count"


def charge(limit: float = 2, amount: float = 1, *, principal: str = "", key: str = KEY, window: int = HOUR) -> Charge:
    return Charge(key, amount, window, limit, "pay charge budget[0]: 2 writes per 1h", principal)


def attempt(n: int, *charges: Charge, principal: str = "p1") -> Attempt:
    return Attempt(
        api="pay",
        operation="charge",
        method="POST",
        target="https://api.pay.test/charges",
        intent_fingerprint=f"sha256:write-{n}",
        intent={"body": {"n": n}},
        principal=principal,
        charges=charges or (charge(),),
    )


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


# --- window math and the plain decision ------------------------------------------------------


@pytest.mark.parametrize(
    "now, seconds, start, end",
    [
        ("2026-03-01T12:59:59.999", HOUR, "2026-03-01T12:00:00", "2026-03-01T13:00:00"),
        ("2026-03-01T13:00:00", HOUR, "2026-03-01T13:00:00", "2026-03-01T14:00:00"),
        ("2026-03-01T23:30:00", 86400, "2026-03-01T00:00:00", "2026-03-02T00:00:00"),  # a day: UTC midnight
        ("2026-03-01T12:01:35", 90, "2026-03-01T12:01:30", "2026-03-01T12:03:00"),  # aligned to the epoch
    ],
)
def test_windows_are_fixed_and_aligned_to_the_utc_epoch(now, seconds, start, end):
    assert window_of(at(now), seconds) == (int(at(start).timestamp()), int(at(end).timestamp()))


def test_over_budget_says_which_budget_why_and_when_its_window_turns():
    now = at("2026-03-01T12:59:20")
    assert over_budget([(charge(limit=2), 1)], now) is None  # the last unit is free
    over = over_budget([(charge(limit=2), 2)], now)
    assert over is not None and over.retry_after == 40
    assert "budget[0]" in over.why and "2 of 2 used" in over.why and "2026-03-01T13:00:00Z" in over.why
    alone = over_budget([(charge(limit=100, amount=150), 0)], now)
    assert alone is not None and "alone is more than the budget" in alone.why
    daily = charge(limit=2, window=86400)
    both = over_budget([(charge(limit=2), 2), (daily, 5)], now)  # the last window to turn decides
    assert both is not None and both.retry_after == 11 * HOUR + 40
    assert over_budget([(charge(limit=0.3, amount=0.1), 0.1 + 0.1)], now) is None  # 0.30000000000000004


# --- counting in the store, on each backend ---------------------------------------------------


def test_a_budget_of_two_admits_two_and_refuses_the_third_recorded_rejected(backend_store, clock):
    clock.now = at("2026-03-01T12:59:20")
    first, second = (backend_store.begin_attempt(attempt(n)) for n in (1, 2))
    assert (first.kind, second.kind) == ("forward", "forward")
    third = backend_store.begin_attempt(attempt(3))
    assert third.kind == "over_budget" and third.retry_after == 40
    assert third.receipt.state is State.REJECTED and third.receipt.idempotency_key is None
    [event] = backend_store.events(third.receipt.operation_id)
    assert event.to_state is State.REJECTED and event.reason.startswith("over budget: pay charge budget[0]")
    assert event.reason.endswith("; not sent")
    assert [u.used for u in backend_store.budget_use(KEY, HOUR)] == [2]  # the refused one took nothing
    clock.advance(40)  # the window turns
    assert backend_store.begin_attempt(attempt(3)).kind == "forward"  # its rejected receipt blocks no retry


@pytest.mark.parametrize("ends, gives_back", [(State.REJECTED, True), (State.NOT_SENT, True)])
def test_a_write_that_ends_rejected_or_not_sent_gives_its_share_back(backend_store, ends, gives_back):
    first = backend_store.begin_attempt(attempt(1)).receipt
    backend_store.begin_attempt(attempt(2))
    assert backend_store.begin_attempt(attempt(3)).kind == "over_budget"
    backend_store.transition(first.operation_id, ends, reason="HTTP 400")
    assert [(u.used, u.writes) for u in backend_store.budget_use(KEY, HOUR)] == [(1, 1)]
    assert backend_store.recount(KEY, HOUR) == {"": 1}  # the kept use is what the receipts say
    assert backend_store.begin_attempt(attempt(4)).kind == "forward"
    assert backend_store.begin_attempt(attempt(5)).kind == "over_budget"
    assert backend_store.recount(KEY, HOUR) == {"": 2}


def test_succeeded_unknown_and_manual_review_keep_their_share(backend_store):
    one = backend_store.begin_attempt(attempt(1)).receipt
    two = backend_store.begin_attempt(attempt(2)).receipt
    backend_store.transition(one.operation_id, State.SUCCEEDED, reason="HTTP 201")
    backend_store.transition(two.operation_id, State.OUTCOME_UNKNOWN, reason="the connection dropped")
    assert backend_store.begin_attempt(attempt(3)).kind == "over_budget"
    backend_store.transition(two.operation_id, State.MANUAL_REVIEW, reason="a person looks")
    assert backend_store.begin_attempt(attempt(4)).kind == "over_budget"
    assert [u.used for u in backend_store.budget_use(KEY, HOUR)] == [2]


def test_a_duplicate_is_not_charged_only_a_new_attempt_is(backend_store):
    first = backend_store.begin_attempt(attempt(1))
    for _ in range(3):
        assert backend_store.begin_attempt(attempt(1)).kind == "blocked"  # in flight: blocked, takes nothing
    backend_store.transition(first.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")
    assert backend_store.begin_attempt(attempt(1)).kind in ("replay", "blocked_succeeded")
    assert [(u.used, u.writes) for u in backend_store.budget_use(KEY, HOUR)] == [(1, 1)]
    assert backend_store.begin_attempt(attempt(2)).kind == "forward"  # the second unit was still there


def test_per_principal_each_caller_has_its_own_and_the_top_users_come_first(backend_store):
    def mine(n: int, who: str) -> Attempt:
        return attempt(n, charge(principal=who), principal=who)

    assert [backend_store.begin_attempt(mine(n, "p1")).kind for n in (1, 2, 3)] == ["forward", "forward", "over_budget"]
    assert backend_store.begin_attempt(mine(4, "p2")).kind == "forward"
    uses = backend_store.budget_use(KEY, HOUR)
    assert [(u.principal, u.used) for u in uses] == [("p1", 2), ("p2", 1)]
    assert [u.principal for u in backend_store.budget_use(KEY, HOUR, top=1)] == ["p1"]


def test_a_sum_counts_amounts_and_every_budget_must_have_room(backend_store):
    daily = charge(limit=500, amount=300, key="pay/charge/budget[1]/86400s/sum:amount", window=86400)
    counted = charge(limit=10)
    assert backend_store.begin_attempt(attempt(1, counted, daily)).kind == "forward"
    refused = backend_store.begin_attempt(attempt(2, counted, daily))  # 300 + 300 > 500
    assert refused.kind == "over_budget" and "300 of 500 used" in refused.reason
    # neither budget was charged for the refused write
    assert [u.used for u in backend_store.budget_use(KEY, HOUR)] == [1]
    small = charge(limit=500, amount=200, key=daily.key, window=86400)
    assert backend_store.begin_attempt(attempt(3, counted, small)).kind == "forward"  # exactly 500
    assert backend_store.recount(daily.key, 86400) == {"": 500}


def test_a_denied_write_takes_no_share(backend_store):
    denied = attempt(1).__class__(**{**attempt(1).__dict__, "denied": "decisions[0]"})
    assert backend_store.begin_attempt(denied).kind == "denied"
    assert backend_store.budget_use(KEY, HOUR) == []


def test_a_receipt_pruned_within_its_window_keeps_its_share(backend_store, clock):
    clock.now = T0
    one = backend_store.begin_attempt(attempt(1, charge(window=86400))).receipt
    backend_store.transition(one.operation_id, State.SUCCEEDED, reason="HTTP 201")
    clock.advance(HOUR)
    assert backend_store.prune(dt.timedelta(minutes=1)) == [one.operation_id]
    assert [u.used for u in backend_store.budget_use(KEY, 86400)] == [1]  # still counted today
    clock.advance(86400)
    backend_store.prune(dt.timedelta(minutes=1))  # its window has ended: the charge and the use go
    assert backend_store._rows("SELECT COUNT(*) AS n FROM budget_charges")[0]["n"] == 0
    assert backend_store._rows("SELECT COUNT(*) AS n FROM budget_use")[0]["n"] == 0


def test_observe_mode_sends_an_over_budget_write_records_it_would_refuse_and_charges_it(backend_store, clock):
    """receipts_mode=observe: nothing refused; the event says what enforcement would have done; the use counts it."""
    clock.now = at("2026-03-01T12:59:20")
    observed = [dataclasses.replace(attempt(n), observe=True) for n in (1, 2, 3)]
    decisions = [backend_store.begin_attempt(a) for a in observed]
    assert [d.kind for d in decisions] == ["forward", "forward", "forward"]
    third = decisions[2]
    assert third.would == ("would_refuse",) and third.receipt.state is State.SUBMITTED
    reasons = [e.reason for e in backend_store.events(third.receipt.operation_id)]
    assert any(r.startswith("would have refused: over budget: pay charge budget[0]") for r in reasons)
    assert [u.used for u in backend_store.budget_use(KEY, HOUR)] == [3]  # what was sent, over the limit
    assert backend_store.begin_attempt(attempt(4)).kind == "over_budget"  # enforce mode: refused
    denied = dataclasses.replace(attempt(5), observe=True, denied="decisions[0]")  # sent in observe mode: counted
    assert backend_store.begin_attempt(denied).would == ("would_deny", "would_refuse")
    assert backend_store.recount(KEY, HOUR) == {"": 4}

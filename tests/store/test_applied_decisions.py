"""
The decisions applied to a receipt, read from its events (store/applied_decisions.py): the events are
written by the store itself (SQLite; reading them is the same on both backends), with the reasons the
approval gate records (store/decision_reasons.py, as mitm/approval.py writes them).
"""

from __future__ import annotations

import dataclasses

import pytest

from proxy_addon.states import State
from proxy_addon.store import Attempt, Store
from proxy_addon.store.applied_decisions import applied_decisions
from proxy_addon.store.decision_reasons import (
    APPROVED,
    DENIED,
    HUNG_UP,
    MODIFIED,
    OPERATOR,
    RULES_CHANGED,
    TIMED_OUT,
    rules_changed,
)
from proxy_addon.store.records import WOULD_HAVE, Charge, Event
from tests.conftest import FakeClock


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "r.db", clock=FakeClock())
    yield s
    s.close()


def attempt(n: int = 1, **more) -> Attempt:
    return Attempt(
        api="pay",
        operation="charge",
        method="POST",
        target="https://api.pay.test/charges",
        intent_fingerprint=f"sha256:write-{n}",
        intent={"body": {"n": n}},
        principal="p1",
        instance="inst-1",
        **more,
    )


def decided(store: Store, operation_id: str) -> list[tuple[str, str, str]]:
    return [(d.kind, d.decision, d.by) for d in applied_decisions(store.events(operation_id))]


ONE_A_DAY = Charge("pay/charge/budget[0]/86400s/count", 1, 86400, 1, "pay charge budget[0]: 1 write per 1d")


def test_a_rules_deny_and_a_budgets_refusal_are_told_apart(store):
    """Both are a new receipt recorded rejected, never sent; the decision says which refused it."""
    denied = store.begin_attempt(attempt(1, denied="decisions[0] (line 9): deny when amount >= 9")).receipt
    store.begin_attempt(attempt(2, charges=(ONE_A_DAY,)))  # takes the day's one write
    over = store.begin_attempt(attempt(3, charges=(ONE_A_DAY,)))
    assert over.kind == "over_budget"
    assert decided(store, denied.operation_id) == [
        ("denied_by_rule", "denied by a rule's decision, never sent", "proxy")
    ]
    assert decided(store, over.receipt.operation_id) == [("over_budget", "refused: over budget, never sent", "proxy")]
    [d] = applied_decisions(store.events(over.receipt.operation_id))
    assert d.why.startswith("over budget: pay charge budget[0]: 1 write per 1d") and d.why.endswith("; not sent")


def test_observe_mode_shows_what_enforcement_would_have_done_and_the_duplicate_it_sent(store):
    """receipts_mode=observe: the would_* events are decisions (sent all the same), and on the receipt a
    duplicate would have been answered from, that the duplicate was sent."""
    first = store.begin_attempt(attempt(1, observe=True, approval=True, approval_why="approve: true")).receipt
    assert decided(store, first.operation_id) == [
        ("would_hold", "observe: would have held it for approval; sent", "proxy")
    ]
    dup = store.begin_attempt(attempt(1, observe=True)).receipt  # the first is unresolved: would have blocked
    assert decided(store, dup.operation_id) == [
        ("would_block", "observe: would have blocked it (a duplicate); sent", "proxy")
    ]
    assert decided(store, first.operation_id)[1:] == [
        ("duplicate_sent", "observe: a duplicate it would have answered was sent", "proxy")
    ]
    denied = store.begin_attempt(attempt(2, observe=True, denied="decisions[1]: deny when amount >= 9")).receipt
    assert [k for k, _, _ in decided(store, denied.operation_id)] == ["would_deny"]
    store.begin_attempt(attempt(3, observe=True, charges=(ONE_A_DAY,)))
    over = store.begin_attempt(attempt(4, observe=True, charges=(ONE_A_DAY,))).receipt
    assert decided(store, over.operation_id) == [
        ("would_refuse", "observe: would have refused it (over budget); sent", "proxy")
    ]


@pytest.mark.parametrize("kind", WOULD_HAVE)
def test_every_would_have_event_is_a_decision(kind):
    e = Event(
        1, "op", "2026-01-01T00:00:00.000000Z", kind, State.SUBMITTED, State.SUBMITTED, "would have ...", "proxy", None
    )
    [d] = applied_decisions([e])
    assert d.kind == kind and d.decision.startswith("observe: would have") and d.decision.endswith("; sent")


def held(store: Store, n: int = 1) -> str:
    r = store.begin_attempt(attempt(n, approval=True)).receipt
    assert r.state is State.AWAITING_APPROVAL
    return r.operation_id


def test_approvals_and_denials_name_who_decided_and_where(store):
    """From the CLI and a link (`decide_approval`, then `apply_approval` as the holding proxy does), and mitmweb's
    Resume and Abort (a transition by `mitmweb`)."""
    by_cli, by_link, resumed, aborted = (held(store, n) for n in (1, 2, 3, 4))
    d = store.decide_approval(by_cli, approve=True, note="refund agreed", actor="cli:alice")
    store.apply_approval(d, fingerprint=d.intent_fingerprint, reason=f"{APPROVED}: refund agreed")
    d = store.decide_approval(by_link, approve=False, note="not this one", actor="link:127.0.0.1")
    store.apply_approval(d, fingerprint=d.intent_fingerprint, reason=f"{DENIED}: not this one")
    store.transition(resumed, State.SUBMITTED, reason=APPROVED, actor=OPERATOR)
    store.transition(aborted, State.REJECTED, reason=DENIED, actor=OPERATOR, error=DENIED)
    held_for = ("held", "held for approval", "proxy")
    assert decided(store, by_cli) == [held_for, ("approved", "approved by alice at the command line", "cli:alice")]
    assert decided(store, by_link) == [
        held_for,
        ("denied", "denied with an approval link (from 127.0.0.1)", "link:127.0.0.1"),
    ]
    assert decided(store, resumed) == [held_for, ("approved", "approved in mitmweb", "mitmweb")]
    assert decided(store, aborted) == [held_for, ("denied", "denied in mitmweb", "mitmweb")]
    [_, approval] = applied_decisions(store.events(by_cli))
    assert approval.why == "approved by operator: refund agreed"  # the note, as the event says it


@pytest.mark.parametrize(
    "reason, kind, decision",
    [
        (f"{TIMED_OUT} (300s)", "timed_out", "denied: no decision within the approval timeout"),
        (
            rules_changed("p1:0000", "cli:alice", "p1:1111"),
            "rules_changed",
            "denied: the operation's rules changed after cli:alice approved it",
        ),
        (
            rules_changed("p1:0000", "mitmweb", None),
            "rules_changed",
            "denied: the operation's rules changed after mitmweb approved it",
        ),
        (  # as versions before decision_reasons.py wrote it: who approved is not said
            f"{RULES_CHANGED} (approved under p1:0000, now p1:1111); send it again to decide anew",
            "rules_changed",
            "denied: the operation's rules changed after it was approved",
        ),
        (MODIFIED, "modified", "denied: the request was modified while held"),
        (HUNG_UP, "hung_up", "denied: the agent hung up while it was held"),
    ],
)
def test_the_proxys_own_denials_of_a_held_write(store, reason, kind, decision):
    operation_id = held(store)
    store.transition(operation_id, State.REJECTED, reason=reason, actor="proxy", error=reason)
    assert decided(store, operation_id)[1:] == [(kind, decision, "proxy")]


def test_a_held_write_the_proxy_stopped_on_is_not_sent(store):
    operation_id = held(store)
    store.transition(operation_id, State.NOT_SENT, reason="proxy stopped while the request awaited approval")
    assert decided(store, operation_id)[1:] == [
        ("not_sent", "not sent (not_sent): the proxy stopped while it was held", "proxy")
    ]


def test_resolutions_and_the_proxys_own_steps(store):
    """A read's verdict and a resolution by hand are decisions; sending and an outcome are not."""
    r = store.begin_attempt(attempt()).receipt
    store.transition(r.operation_id, State.OUTCOME_UNKNOWN, reason="upstream reset")
    store.claim_for_reconcile(r.operation_id, actor="proxy")
    store.transition(r.operation_id, State.MANUAL_REVIEW, reason="absence not provable", expect=[State.RECONCILING])
    store.resolve(r.operation_id, State.SUCCEEDED, note="on the dashboard", actor="cli:bob")
    assert decided(store, r.operation_id) == [
        ("reconciled", "reconciled with a read: manual_review", "proxy"),
        ("resolved", "resolved by hand as succeeded", "cli:bob"),
    ]
    plain = store.begin_attempt(dataclasses.replace(attempt(2))).receipt
    store.transition(plain.operation_id, State.SUCCEEDED, reason="HTTP 201")
    assert decided(store, plain.operation_id) == []

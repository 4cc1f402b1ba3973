"""
Idempotency keys in the store, on each backend, on a clock the tests move: which key a new
attempt is sent with (store/attempts.py `continues`: the remembered key wins over the agent's),
and how long a key reused by a retry counts as remembered (its `ttl` from its first use,
`idempotency_key_at`, never from the retry's own submitted_at).
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qs, urlsplit

from proxy_addon.reconcile.http_reads import plan_read
from proxy_addon.reconcile.settle import key_dedupes, reconcilable_now, retry_after
from proxy_addon.rules import load_rules
from proxy_addon.states import State
from proxy_addon.store import Attempt, Decision, Receipt, Store, iso
from tests.conftest import T0, FakeClock

HOUR = 3600

RULES = """
api: pay
hosts: [api.pay.test]
operations:
  charges.create:
    match: {method: POST, path: /v1/charges}
    fingerprint: {body: [amount]}
    idempotency_key: {header: Idempotency-Key, ttl: 24h}
    reconcile:
      read: {method: GET, url: "/v1/charges?created[gte]={submitted_at_unix}"}
      items: data
      find: {amount: "{intent.amount}"}
      absence_provable: true
      retry_when_absent: true
"""
OP = load_rules(RULES, "pay.yaml").operations[0]


def attempt(**more) -> Attempt:
    base = {"intent_fingerprint": "sha256:charge-500", "intent": {"form": {"amount": "500"}}}
    return Attempt(
        api="pay",
        operation="charges.create",
        method="POST",
        target="https://api.pay.test/v1/charges",
        principal="p1",
        idempotency=True,
        **{**base, **more},
    )


def unknown(store: Store, r: Receipt) -> Receipt:
    return store.transition(r.operation_id, State.OUTCOME_UNKNOWN, reason="the connection dropped")


def safe_to_retry(store: Store, r: Receipt, why: str = "the API deduplicates by Idempotency-Key") -> Receipt:
    store.claim_for_reconcile(r.operation_id, actor="test")
    return store.transition(r.operation_id, State.SAFE_TO_RETRY, reason=why, expect=[State.RECONCILING])


# --- a key's lifetime on a retry that reused it ---------------------------------------------


def test_a_key_first_sent_25_hours_ago_is_not_remembered_however_recent_the_retry(backend_store, clock: FakeClock):
    store = backend_store
    first = store.begin_attempt(attempt()).receipt  # T0: the key is first sent
    unknown(store, first)
    clock.advance(23 * HOUR)
    assert key_dedupes(OP, store.get(first.operation_id), clock())  # 23 h: the API still has it
    safe_to_retry(store, first)
    retry = store.begin_attempt(attempt()).receipt  # T0 + 23 h: the retry reuses the key
    assert (retry.retry_of, retry.idempotency_key) == (first.operation_id, first.idempotency_key)
    assert retry.submitted_at == iso(T0 + dt.timedelta(hours=23)) and retry.idempotency_key_at == first.submitted_at
    retry = unknown(store, retry)

    clock.advance(2 * HOUR)  # T0 + 25 h: the retry is 2 hours old, its key 25
    now = clock()
    assert not key_dedupes(OP, retry, now)
    # What follows from it: the next duplicate reads (no "safe to resend with the key"), and
    # the read looks from the key's first use, when the first attempt may have made the charge.
    assert reconcilable_now(OP, retry, now) and retry_after(OP, retry, now) is None
    query = parse_qs(urlsplit(plan_read(OP, retry).url).query)
    assert query["created[gte]"] == [str(int(T0.timestamp()))]
    # Within the 24 hours, counted from the first use, it still dedupes.
    assert key_dedupes(OP, retry, T0 + dt.timedelta(hours=23, minutes=59))


# --- which key a new attempt is sent with -----------------------------------------------------


def test_a_retry_after_safe_to_retry_or_not_sent_is_sent_with_the_remembered_key_not_the_agents(backend_store):
    """An agent's own body id (given_key) or header key (client_key) on a retry: the key its
    predecessor went with wins, whether that one became safe_to_retry or not_sent."""
    store = backend_store
    first = store.begin_attempt(attempt(given_key="agent-id-1", client_key="ck-1")).receipt
    assert first.idempotency_key == "agent-id-1"  # a new attempt: the agent's own id is the key
    safe_to_retry(store, unknown(store, first))
    second = store.begin_attempt(attempt(given_key="agent-id-2", client_key="ck-2")).receipt
    assert (second.retry_of, second.idempotency_key) == (first.operation_id, "agent-id-1")
    store.transition(second.operation_id, State.NOT_SENT, reason="connection refused")
    third = store.begin_attempt(attempt(client_key="ck-3")).receipt  # a header key of the agent's: client_key only
    assert (third.retry_of, third.idempotency_key) == (second.operation_id, "agent-id-1")
    assert (first.client_key, second.client_key, third.client_key) == ("ck-1", "ck-2", "ck-3")


def test_after_a_refusal_the_key_is_renewed_unless_the_agent_sends_the_same_key_again(backend_store):
    store = backend_store
    first = store.begin_attempt(attempt(client_key="ck-1")).receipt
    assert first.idempotency_key == f"receipt-{first.operation_id}"
    store.transition(first.operation_id, State.REJECTED, reason="HTTP 400")
    # The agent's same key again: the same request, sent with the key it went with.
    same = store.begin_attempt(attempt(client_key="ck-1")).receipt
    assert (same.retry_of, same.idempotency_key) == (first.operation_id, first.idempotency_key)
    store.transition(same.operation_id, State.REJECTED, reason="HTTP 400")
    # Another key of the agent's (or none): a new key, the agent's own body id where it has one.
    fresh = store.begin_attempt(attempt(client_key="ck-2")).receipt
    assert fresh.idempotency_key == f"receipt-{fresh.operation_id}" != first.idempotency_key
    store.transition(fresh.operation_id, State.REJECTED, reason="HTTP 400")
    own = store.begin_attempt(attempt(given_key="agent-id-9")).receipt
    assert own.idempotency_key == "agent-id-9"


def test_the_agents_key_still_identifies_its_request_when_another_key_was_sent(backend_store):
    """draft-ietf-httpapi-idempotency-key-header: the agent's key (client_key) names the request
    it first came with, whatever key went upstream; with another request it is a key_conflict."""
    store = backend_store
    first = store.begin_attempt(attempt(client_key="ck-1")).receipt
    safe_to_retry(store, unknown(store, first))
    second = store.begin_attempt(attempt(client_key="ck-2")).receipt
    assert second.idempotency_key == first.idempotency_key
    other = {"intent_fingerprint": "sha256:charge-600", "intent": {"form": {"amount": "600"}}}
    for ck, receipt in (("ck-1", first), ("ck-2", second)):
        d = store.begin_attempt(attempt(client_key=ck, **other))
        assert (d.kind, d.receipt.operation_id) == ("key_conflict", receipt.operation_id)


def test_a_receipt_from_before_versions_whose_agent_sent_its_own_key_does_not_dedupe_by_the_recorded_key():
    """Before this version the agent's own header key went upstream, and the receipt recorded another."""
    import dataclasses

    now = T0 + dt.timedelta(hours=1)
    base = Receipt(
        operation_id="r1",
        api="pay",
        operation="charges.create",
        method="POST",
        target="t",
        state=State.OUTCOME_UNKNOWN,
        intent_fingerprint="sha256:x",
        intent={},
        principal="p1",
        submitted_at=iso(T0),
        updated_at=iso(T0),
        completed_at=None,
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance=None,
        idempotency_key="receipt-r1",
        idempotency_key_at=iso(T0),
        fingerprint_scheme=3,
        client_key="hmac:agent",
    )
    assert key_dedupes(OP, base, now)  # today: the recorded key is the one that went upstream
    assert key_dedupes(OP, dataclasses.replace(base, fingerprint_scheme=None, client_key=None), now)
    assert not key_dedupes(OP, dataclasses.replace(base, fingerprint_scheme=None), now)


def test_a_denied_attempt_is_recorded_rejected_with_its_rule_as_error_and_no_key(backend_store):
    """A `deny` decision (intent/decisions.py): a new receipt, rejected, its error the rule's; no duplicate
    event, no key; a retry of it is denied again under a receipt of its own (rejected never blocks)."""
    why = "decisions[0] (line 9): deny when to not_ends_with '@example.com'"
    first = backend_store.begin_attempt(attempt(denied=why))
    assert first.kind == "denied" and first.reason == f"denied by policy {why}; not sent"
    again = backend_store.begin_attempt(attempt(denied=why))
    assert again.kind == "denied" and again.receipt.retry_of == first.receipt.operation_id
    for d in (first, again):
        r = backend_store.get(d.receipt.operation_id)
        assert (r.state, r.error, r.idempotency_key) == (State.REJECTED, f"denied by policy {why}", None)
        assert d.receipt.error == r.error  # as inserted, not read back
        (event,) = backend_store.events(r.operation_id)  # no "blocked" event: it is no duplicate
        assert (event.from_state, event.to_state, event.reason) == (None, State.REJECTED, d.reason)
    allowed = backend_store.begin_attempt(attempt())  # the rule changed: the same intent is sent
    assert allowed.kind == "forward" and allowed.receipt.idempotency_key is not None


# --- observe mode (receipts_mode=observe): every decision recorded, none enforced ---------------


def kinds(store: Store, operation_id: str) -> list[str]:
    return [e.event for e in store.events(operation_id)]


def test_observe_mode_sends_a_duplicate_of_an_unresolved_receipt_as_its_own_under_the_same_key(backend_store):
    """Enforcement would block it; observe mode inserts a receipt for it (`shadow_of` names the first),
    sent with the first's key (never renewed without proof), and both receipts' events say so."""
    store = backend_store
    first = unknown(store, store.begin_attempt(attempt(observe=True)).receipt)
    d = store.begin_attempt(attempt(observe=True))
    second = d.receipt
    assert (d.kind, d.would) == ("forward", ("would_block",))
    assert (second.state, second.shadow_of, second.retry_of) == (
        State.SUBMITTED,
        first.operation_id,
        first.operation_id,
    )
    assert second.idempotency_key == first.idempotency_key
    assert kinds(store, second.operation_id) == ["transition", "would_block"]
    (would,) = [e for e in store.events(second.operation_id) if e.event == "would_block"]
    assert would.reason.startswith(f"would have blocked: duplicate of receipt {first.operation_id} (outcome_unknown)")
    assert kinds(store, first.operation_id) == ["transition", "transition", "duplicate_sent"]
    assert store.get(second.operation_id).shadow_of == first.operation_id  # as read back
    # A third: both are unresolved; it duplicates the latest of them, and is sent too.
    third = store.begin_attempt(attempt(observe=True))
    assert (third.kind, third.receipt.shadow_of) == ("forward", second.operation_id)
    # The same duplicate in enforce mode: blocked, nothing inserted.
    assert store.begin_attempt(attempt()).kind == "blocked"
    assert len(store.list(limit=None)) == 3


def test_after_observe_mode_enforcement_still_finds_an_unresolved_receipt_behind_a_resolved_later_one(backend_store):
    """A receipt observe mode sent may resolve before its original: the original, still unresolved,
    blocks the next write (it is read first), where the latest alone would have let a second one in."""
    store = backend_store
    first = unknown(store, store.begin_attempt(attempt()).receipt)
    shadow = store.begin_attempt(attempt(observe=True)).receipt
    store.transition(shadow.operation_id, State.REJECTED, reason="HTTP 400")
    d = store.begin_attempt(attempt())
    assert (d.kind, d.receipt.operation_id) == ("blocked", first.operation_id)
    observed = store.begin_attempt(attempt(observe=True))
    assert (observed.would, observed.receipt.shadow_of) == (("would_block",), first.operation_id)


def test_observe_mode_does_not_hold_or_deny_it_records_that_it_would_have(backend_store):
    store = backend_store
    held = store.begin_attempt(attempt(observe=True, approval=True, approval_why="decisions[0]: approve when x"))
    assert (held.kind, held.receipt.state, held.would) == ("forward", State.SUBMITTED, ("would_hold",))
    (e,) = [e for e in store.events(held.receipt.operation_id) if e.event == "would_hold"]
    assert e.reason == "would have held for approval (decisions[0]: approve when x); sent (receipts_mode=observe)"
    store.transition(held.receipt.operation_id, State.REJECTED, reason="HTTP 400")
    denied = store.begin_attempt(attempt(observe=True, denied="decisions[1] (line 9): deny when amount >= 9"))
    assert (denied.kind, denied.receipt.state, denied.would) == ("forward", State.SUBMITTED, ("would_deny",))
    assert denied.receipt.idempotency_key  # sent: with a key, as any write
    (e,) = [e for e in store.events(denied.receipt.operation_id) if e.event == "would_deny"]
    assert e.reason.startswith("would have denied by policy decisions[1] (line 9)")
    store.transition(denied.receipt.operation_id, State.REJECTED, reason="HTTP 400")
    # enforce mode: held, and denied
    assert store.begin_attempt(attempt(approval=True)).receipt.state is State.AWAITING_APPROVAL


def test_observe_mode_records_a_duplicate_of_a_success_as_would_have_blocked_or_replayed(backend_store):
    store = backend_store
    first = store.begin_attempt(attempt(observe=True)).receipt
    store.record_outcome(first.operation_id, State.SUCCEEDED, reason="HTTP 201")
    d = store.begin_attempt(attempt(observe=True), after_success="block")
    assert (d.kind, d.would, d.receipt.shadow_of) == ("forward", ("would_block",), first.operation_id)
    assert "(succeeded): the operation already succeeded" in store.events(d.receipt.operation_id)[-1].reason


def test_observe_mode_is_never_answered_on_the_event_loops_connection(tmp_path):
    """`answer_duplicate` answers a duplicate without a durable commit: observe mode inserts one, so never there."""
    store = Store.open(str(tmp_path / "r.db"), lock_timeout=0)
    try:
        unknown(store, store.begin_attempt(attempt()).receipt)
        assert store.answer_duplicate(attempt(observe=True)) == "new"
        assert isinstance(store.answer_duplicate(attempt()), Decision)
    finally:
        store.close()


def test_a_write_a_decision_holds_says_which_entry_held_it(backend_store):
    """The first event of a write an `approve` decision held names the entry (what `receipts show` reads)."""
    why = "decisions[1] (line 12): approve when amount >= 100000: large refunds need a person"
    held = backend_store.begin_attempt(attempt(approval=True, approval_why=why))
    assert held.receipt.state is State.AWAITING_APPROVAL
    (event,) = backend_store.events(held.receipt.operation_id)
    assert event.reason == f"new attempt, held for approval by {why}"  # before: "new attempt"
    plain = backend_store.begin_attempt(
        attempt(intent_fingerprint="sha256:other", approval=True, approval_why="approve: true")
    )
    assert backend_store.events(plain.receipt.operation_id)[0].reason == "new attempt"

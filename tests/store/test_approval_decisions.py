"""
Operators' decisions on held writes in the store (`approval_decisions`, m007): recorded only
for a receipt awaiting approval, held by a running proxy, once; bound to the receipt and its
intent fingerprint; used once, in the transaction that moves the receipt.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from proxy_addon.errors import IllegalTransition, StoreError, UnknownReceipt
from proxy_addon.states import State
from proxy_addon.store import Attempt, Store, iso

FP = "sha256:" + "ab" * 32


@pytest.fixture
def store(backend_store):
    """On each backend (m007 is one migration for both)."""
    return backend_store


def held(store: Store, fp: str = FP, instance: str = "inst-1") -> str:
    d = store.begin_attempt(
        Attempt(
            api="shop",
            operation="refunds.create",
            method="POST",
            target="https://api.shop.test/v1/refunds",
            intent_fingerprint=fp,
            intent={"body": {"amount": 10}},
            principal="hmac:1234",
            instance=instance,
            approval=True,
        )
    )
    assert (d.kind, d.receipt.state) == ("forward", State.AWAITING_APPROVAL)
    return d.receipt.operation_id


def tables(store: Store) -> tuple[list, list, list]:
    q = store._rows
    return (
        q("SELECT * FROM receipts ORDER BY operation_id"),
        q("SELECT * FROM receipt_events ORDER BY id"),
        q("SELECT * FROM approval_decisions ORDER BY operation_id"),
    )


def test_an_approval_is_recorded_then_used_once_with_the_transition(store, clock):
    rid = held(store)
    d = store.decide_approval(rid, approve=True, note="  ok by finance ", actor="cli:alice")
    assert (d.operation_id, d.intent_fingerprint, d.decision, d.note, d.actor, d.decided_at, d.consumed_at) == (
        rid,
        FP,
        "approved",
        "ok by finance",
        "cli:alice",
        iso(clock.now),
        None,
    )
    assert store.get(rid).state is State.AWAITING_APPROVAL  # recorded; the proxy applies it
    assert store.approval_decisions([rid, "other"]) == {rid: d}
    t = clock.advance(1)
    r = store.apply_approval(d, fingerprint=FP, reason="approved by operator: ok by finance", flow_id="flow-9")
    assert (r.state, r.error) == (State.SUBMITTED, None)
    last = store.events(rid)[-1]
    assert (last.from_state, last.to_state, last.actor, last.reason, last.flow_id) == (
        State.AWAITING_APPROVAL,
        State.SUBMITTED,
        "cli:alice",
        "approved by operator: ok by finance",
        "flow-9",
    )
    assert store.approval_decision(rid).consumed_at == iso(t)
    assert store.approval_decisions([rid]) == {}  # used: no proxy looks at it again
    before = tables(store)
    with pytest.raises(IllegalTransition, match="used already"):
        store.apply_approval(d, fingerprint=FP, reason="again")
    assert tables(store) == before


def test_a_denial_rejects_the_receipt_with_its_note(store):
    rid = held(store)
    with pytest.raises(ValueError, match="needs a note"):
        store.decide_approval(rid, approve=False, note="  ", actor="cli:bob")
    d = store.decide_approval(rid, approve=False, note="too much", actor="cli:bob")
    r = store.apply_approval(d, fingerprint=FP, reason="denied by operator: too much")
    assert (r.state, r.error) == (State.REJECTED, "denied by operator: too much")
    assert store.events(rid)[-1].actor == "cli:bob"


def test_a_held_write_is_decided_once(store):
    rid = held(store)
    store.decide_approval(rid, approve=True, note="", actor="cli:alice")
    before = tables(store)
    with pytest.raises(IllegalTransition, match=f"receipt {rid} was already approved by cli:alice at .*decided once"):
        store.decide_approval(rid, approve=False, note="no, wait", actor="cli:bob")
    assert tables(store) == before


@pytest.mark.parametrize("to", [State.SUBMITTED, State.REJECTED, State.NOT_SENT])
def test_only_a_receipt_awaiting_approval_can_be_decided(store, to):
    rid = held(store)
    store.transition(rid, to, reason="decided in mitmweb", actor="mitmweb operator")
    before = tables(store)
    with pytest.raises(IllegalTransition, match=f"receipt {rid} is {to}, not awaiting_approval"):
        store.decide_approval(rid, approve=True, note="", actor="cli:alice")
    with pytest.raises(UnknownReceipt):
        store.decide_approval("20260101T000000Z-0000000000", approve=True, note="", actor="cli:alice")
    assert tables(store) == before


def test_a_write_whose_proxy_stopped_cannot_be_decided(store):
    rid = held(store, instance="dead-1")
    asked: list = []

    def is_alive(instance: str | None) -> bool:
        asked.append(instance)
        return False

    before = tables(store)
    with pytest.raises(IllegalTransition, match=r"the proxy that held it \(instance dead-1\) has stopped"):
        store.decide_approval(rid, approve=True, note="", actor="cli:alice", is_alive=is_alive)
    assert asked == ["dead-1"]
    assert tables(store) == before


def test_a_decision_binds_to_the_fingerprint_the_operator_saw(store):
    rid = held(store)
    before = tables(store)
    with pytest.raises(IllegalTransition, match=f"has the intent fingerprint {FP}, not sha256:abac"):
        store.decide_approval(rid, approve=True, note="", actor="cli:alice", fingerprint="sha256:abac")
    assert tables(store) == before
    d = store.decide_approval(rid, approve=True, note="", actor="cli:alice", fingerprint="sha256:abababab")
    assert d.intent_fingerprint == FP  # the whole fingerprint is recorded


def test_a_decision_for_another_intent_is_never_applied(store):
    """The held write's fingerprint, the receipt's and the decision's must be one: else nothing is written."""
    rid = held(store)
    d = store.decide_approval(rid, approve=True, note="", actor="cli:alice")
    before = tables(store)
    with pytest.raises(IllegalTransition, match="not applied"):
        store.apply_approval(d, fingerprint="sha256:" + "cd" * 32, reason="approved")
    assert tables(store) == before
    # The row changed under the decision (a restore, a hand edit): refused as well.
    store._execute(
        "UPDATE approval_decisions SET intent_fingerprint = ? WHERE operation_id = ?", ("sha256:" + "cd" * 32, rid)
    )
    changed = store.approval_decisions([rid])[rid]
    before = tables(store)
    for decision in (d, changed):
        with pytest.raises(IllegalTransition):
            store.apply_approval(decision, fingerprint=FP, reason="approved")
    assert tables(store) == before
    assert store.get(rid).state is State.AWAITING_APPROVAL


def test_a_decision_that_lost_to_mitmweb_stays_unused(store):
    """mitmweb's Resume moved the receipt first: applying the CLI's decision fails and uses nothing."""
    rid = held(store)
    d = store.decide_approval(rid, approve=False, note="no", actor="cli:bob")
    store.transition(
        rid, State.SUBMITTED, reason="approved by operator", actor="mitmweb operator", expect=[State.AWAITING_APPROVAL]
    )
    before = tables(store)
    with pytest.raises(IllegalTransition, match="is submitted"):
        store.apply_approval(d, fingerprint=FP, reason="denied by operator: no")
    assert tables(store) == before  # rolled back: the decision is not marked used
    assert store.approval_decision(rid).consumed_at is None


def race(path, rid: str, fp: str) -> list[str]:
    """The proxy applying the CLI's denial and mitmweb's resume, on two connections released together."""
    setup = Store.open(path)
    d = setup.decide_approval(rid, approve=False, note="no", actor="cli:bob")
    setup.close()
    barrier = threading.Barrier(2)
    won: list[str] = []

    def run(name, fn):
        s = Store.open(path)
        try:
            barrier.wait(timeout=10)
            fn(s)
            won.append(name)
        except IllegalTransition:
            pass
        finally:
            s.close()

    threads = [
        threading.Thread(
            target=run, args=("cli", lambda s: s.apply_approval(d, fingerprint=fp, reason="denied by operator: no"))
        ),
        threading.Thread(
            target=run,
            args=(
                "mitmweb",
                lambda s: s.transition(
                    rid,
                    State.SUBMITTED,
                    reason="approved by operator",
                    actor="mitmweb operator",
                    expect=[State.AWAITING_APPROVAL],
                ),
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    return won


def test_the_cli_and_mitmweb_racing_exactly_one_wins(tmp_path):
    """Two connections (the CLI's decision applied by the proxy, and mitmweb's resume) at once, many times."""
    path = tmp_path / "race.db"
    store = Store.open(path)
    for round_ in range(20):
        fp = f"sha256:{round_:064x}"
        rid = held(store, fp)
        won = race(path, rid, fp)
        assert len(won) == 1, won
        decision = store.approval_decision(rid)
        assert decision is not None
        r, used = store.get(rid), decision.consumed_at is not None
        assert (r.state, used) == ((State.REJECTED, True) if won == ["cli"] else (State.SUBMITTED, False))
        assert [e.to_state for e in store.events(rid)] == [State.AWAITING_APPROVAL, r.state]
    store.close()


def test_the_table_keeps_one_decision_per_receipt_of_two_kinds(store):
    rid = held(store)
    q = (
        "INSERT INTO approval_decisions (operation_id, intent_fingerprint, decision, note, actor, decided_at) "
        "VALUES (?, ?, ?, '', 'x', 't')"
    )
    # Through the store's own write transaction, on each backend: the database refuses each.
    for params, refusal in (
        ((rid, FP, "maybe"), "(?i)check"),
        (("no-such-receipt", FP, "approved"), "(?i)foreign key"),
        ((rid, FP, "approved"), None),
        ((rid, FP, "denied"), "(?i)unique"),
    ):
        if refusal is None:
            with store._write():
                store._execute(q, params)
            continue
        with pytest.raises(StoreError, match=refusal), store._write():
            store._execute(q, params)


def test_prune_removes_a_decision_with_its_receipt(store, clock):
    rid = held(store)
    d = store.decide_approval(rid, approve=False, note="no", actor="cli:bob")
    store.apply_approval(d, fingerprint=FP, reason="denied by operator: no")
    clock.advance(3 * 86400)
    assert store.prune(dt.timedelta(days=1)) == [rid]
    assert tables(store) == ([], [], [])


def test_a_link_decides_once_and_is_told_it_was_used(store):
    """A decision from an approval link keeps the link's id and rules' version; the same link again: LinkUsed."""
    from proxy_addon.errors import LinkUsed

    rid = held(store)
    d = store.decide_approval(
        rid, approve=True, note="", actor="link:127.0.0.1", fingerprint=FP, rules_version="p1:aa", link="L1"
    )
    assert (d.actor, d.rules_version, d.link) == ("link:127.0.0.1", "p1:aa", "L1")
    assert store.approval_decision(rid) == d
    before = tables(store)
    with pytest.raises(LinkUsed, match=f"this link was used already: receipt {rid} was approved with it by link:"):
        store.decide_approval(rid, approve=True, note="", actor="link:127.0.0.1", link="L1")
    with pytest.raises(IllegalTransition, match=r"was already approved by link:127\.0\.0\.1") as other:
        store.decide_approval(rid, approve=False, note="no", actor="link:127.0.0.1", link="L2")  # the deny link
    assert not isinstance(other.value, LinkUsed)
    store.apply_approval(d, fingerprint=FP, reason="approved by operator")
    with pytest.raises(LinkUsed):  # after it was applied too: still "used", not merely "not awaiting approval"
        store.decide_approval(rid, approve=True, note="", actor="link:10.0.0.9", link="L1")
    assert tables(store)[2] == [{**before[2][0], "consumed_at": store.approval_decision(rid).consumed_at}]


def test_a_link_for_another_fingerprint_records_nothing(store):
    rid = held(store)
    before = tables(store)
    with pytest.raises(IllegalTransition, match="not the write you meant"):
        store.decide_approval(rid, approve=True, note="", actor="link:x", fingerprint="sha256:" + "cd" * 32, link="L")
    assert tables(store) == before

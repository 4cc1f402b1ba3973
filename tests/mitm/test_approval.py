"""
Decisions from another process (`receipts approve` / `deny`, recorded in the store) applied to
the write the addon holds, as mitmweb's Resume and Abort are; driven with taddons, no sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from proxy_addon.mitm import approval
from proxy_addon.mitm.flows import MARKERS
from proxy_addon.store import Store
from tests.conftest import deadline
from tests.mitm.conftest import held, order


def decide(tmp, operation_id: str, *, approve: bool, note: str = "", actor: str = "cli:alice"):
    """What `receipts approve` / `deny` records, from a connection of its own."""
    s = Store.open(tmp / "r.db", create=False)
    try:
        return s.decide_approval(operation_id, approve=approve, note=note, actor=actor)
    finally:
        s.close()


def receipt_and_decision(tmp, operation_id: str):
    s = Store.open(tmp / "r.db", create=False)
    try:
        return s.get(operation_id), s.approval_decision(operation_id), s.events(operation_id)
    finally:
        s.close()


async def test_an_approval_from_the_cli_sends_the_held_write_within_a_second(setup):
    addon, _, tmp = setup
    f = order("C-1", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    decided_at = time.monotonic()
    decide(tmp, operation_id, approve=True, note="refund agreed")
    await asyncio.wait_for(task, deadline(2))
    # The next look applies it: POLL (0.5 s) on a quiet machine; never receipts_approval_timeout (300 s).
    assert time.monotonic() - decided_at < deadline(10 * approval.POLL)
    assert f.response is None and not f.intercepted  # approved: forwarded, out of the intercept
    assert f.marked == MARKERS["submitted"]
    r, d, events = receipt_and_decision(tmp, operation_id)
    assert r.state == "submitted" and d.consumed_at is not None
    assert (events[-1].from_state, events[-1].to_state, events[-1].actor, events[-1].reason, events[-1].flow_id) == (
        "awaiting_approval",
        "submitted",
        "cli:alice",
        "approved by operator: refund agreed",
        f.id,
    )


async def test_a_denial_from_the_cli_answers_403_with_the_note(setup):
    addon, _, tmp = setup
    f = order("C-2", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    decide(tmp, operation_id, approve=False, note="amount too high", actor="cli:bob")
    await asyncio.wait_for(task, deadline(2))
    assert f.response is not None
    assert f.response.status_code == 403
    body = f.response.json()
    assert (body["error"], body["reason"], body["sent"]) == (
        "denied_by_operator",
        "denied by operator: amount too high",
        False,
    )
    assert f.marked == MARKERS["rejected"] and f.comment.startswith("rejected (denied by operator: amount too high) · ")
    r, d, events = receipt_and_decision(tmp, operation_id)
    assert (r.state, r.error, d.consumed_at is not None) == ("rejected", "denied by operator: amount too high", True)
    assert (events[-1].actor, events[-1].reason) == ("cli:bob", "denied by operator: amount too high")


async def test_a_held_write_edited_in_mitmweb_is_denied_though_the_cli_approved_it(setup):
    addon, _, tmp = setup
    f = order("C-3", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    f.backup()
    f.request.text = '{"sku": "C-3", "amount": 1000000}'  # mitmweb's request editor
    decide(tmp, operation_id, approve=True)
    await asyncio.wait_for(task, deadline(2))
    assert f.response is not None
    assert f.response.status_code == 403 and "modified while held" in f.response.json()["reason"]
    r, d, events = receipt_and_decision(tmp, operation_id)
    assert (r.state, d.consumed_at) == ("rejected", None)  # the approval was not used
    assert events[-1].actor == "proxy"


async def test_a_decision_for_another_intent_is_not_applied_and_the_write_stays_held(setup, caplog):
    addon, _, tmp = setup
    f = order("C-4", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    decide(tmp, operation_id, approve=True)
    s = Store.open(tmp / "r.db", create=False)
    s.conn.execute(
        "UPDATE approval_decisions SET intent_fingerprint = 'sha256:0000' WHERE operation_id = ?", (operation_id,)
    )
    s.close()
    with caplog.at_level(logging.ERROR):
        await asyncio.sleep(approval.POLL * 3)
    assert f.intercepted and not task.done()
    said = [m for m in caplog.messages if "is for the intent sha256:0000" in m]
    assert len(said) == 1 and said[0].endswith("not applied")  # said once, not at every look
    f.kill()  # mitmweb's Abort still decides it
    await asyncio.wait_for(task, deadline(2))
    r, d, _ = receipt_and_decision(tmp, operation_id)
    assert (r.state, r.error, d.consumed_at) == ("rejected", "denied by operator", None)


@pytest.mark.parametrize("first", ["mitmweb", "cli"])
async def test_mitmweb_and_the_cli_deciding_at_once_exactly_one_wins(setup, first):
    """Resume in mitmweb, deny from the CLI: whichever the proxy sees first is applied; the other is not."""
    addon, _, tmp = setup
    f = order(f"C-5-{first}", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    decide(tmp, operation_id, approve=False, note="no")
    if first == "cli":
        await addon.approvals.look()  # the proxy's look finds it before the Resume
    f.resume()
    await asyncio.wait_for(task, deadline(2))
    r, d, events = receipt_and_decision(tmp, operation_id)
    assert [e.to_state for e in events] == ["awaiting_approval", r.state]  # one decision applied
    if first == "mitmweb":
        assert (r.state, d.consumed_at, events[-1].actor, f.response) == ("submitted", None, "mitmweb", None)
    else:
        assert (r.state, d.consumed_at is not None, events[-1].actor) == ("rejected", True, "cli:alice")
        assert f.response is not None
        assert f.response.status_code == 403


async def test_nothing_is_looked_up_while_no_write_is_held(setup):
    addon, _, _ = setup
    f = order("C-6", path="/v1/refunds")
    task = await held(addon, f)
    looking = addon.approvals._task
    assert looking is not None and not looking.done()
    f.resume()
    await asyncio.wait_for(task, deadline(2))
    await asyncio.wait_for(looking, deadline(approval.POLL * 2 + 1))  # the looks stop with the last held write


async def test_a_look_that_fails_is_said_once_and_the_next_ones_still_apply_the_decision(setup, caplog):
    """The store cannot be read for a while (locked, say): the held write waits; once it can, the decision applies."""
    from proxy_addon.errors import StoreError

    addon, _, tmp = setup
    real = addon.calls
    failures: list[int] = []

    async def calls(fn):
        if len(failures) < 3 and "approval_decisions" in fn.__code__.co_names:  # the looks, not the rest
            failures.append(1)
            raise StoreError("cannot read the receipts database r.db: database is locked")
        return await real(fn)

    addon.calls = calls
    try:
        f = order("C-7", path="/v1/refunds")
        task = await held(addon, f)
        operation_id = f.metadata["receipts"]["operation_id"]
        decide(tmp, operation_id, approve=True)
        with caplog.at_level(logging.WARNING):
            await asyncio.wait_for(task, deadline(approval.POLL * 6))
    finally:
        addon.calls = real
    assert len(failures) == 3
    said = [m for m in caplog.messages if "could not look for approval decisions" in m]
    assert said == [
        "receipt-proxy: could not look for approval decisions: cannot read the receipts database r.db: "
        "database is locked"
    ]
    assert f.response is None and receipt_and_decision(tmp, operation_id)[0].state == "submitted"


@pytest.mark.parametrize("by", ["cli", "mitmweb"])
async def test_an_approval_under_rules_changed_while_the_write_was_held_does_not_send_it(setup, by):
    """The operation's rules are edited while its write waits: an approval, from the CLI or mitmweb, denies it."""
    from tests.mitm.conftest import RULES

    addon, tctx, tmp = setup
    f = order(f"C-8-{by}", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    edited = tmp / "edited.yaml"
    edited.write_text(
        RULES.replace(
            "fingerprint: {body: [sku]}\n    approve: true", "fingerprint: {body: [sku, qty]}\n    approve: true"
        )
    )
    tctx.configure(addon, receipts_rules=str(edited))
    if by == "cli":
        decide(tmp, operation_id, approve=True, note="fine")
    else:
        f.resume()
    await asyncio.wait_for(task, deadline(5))
    assert f.response is not None and f.response.status_code == 403
    assert "the operation's rules changed while the write was held" in f.response.json()["reason"]
    r, d, events = receipt_and_decision(tmp, operation_id)
    assert r.state == "rejected" and r.error.startswith(approval.RULES_CHANGED)
    assert f"by {'cli:alice' if by == 'cli' else 'mitmweb'}, now " in r.error  # who approved it
    assert (events[-1].from_state, events[-1].actor) == ("awaiting_approval", "proxy")
    if by == "cli":
        assert d.consumed_at is None  # not used: it did not release the write


async def test_a_decision_given_under_another_rules_version_does_not_send_the_write(setup):
    """A link's decision names the rules' version it was made under: another one than the held write's is refused."""
    addon, _, tmp = setup
    f = order("C-9", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    s = Store.open(tmp / "r.db", create=False)
    s.decide_approval(operation_id, approve=True, note="", actor="link:127.0.0.1", rules_version="p1:0000", link="L")
    s.close()
    await asyncio.wait_for(task, deadline(5))
    assert f.response is not None and f.response.status_code == 403
    r, d, _ = receipt_and_decision(tmp, operation_id)
    assert r.state == "rejected" and "approved under p1:0000 by link:127.0.0.1" in r.error and d.consumed_at is None


async def test_a_held_write_is_told_to_notify_once_with_its_expiry_and_rules_version(setup):
    from proxy_addon.rules.policy_version import policy_version
    from proxy_addon.store import utcnow

    addon, _, _ = setup
    told: list = []
    addon.approvals.notify = lambda receipt, expires_at, version: told.append((receipt, expires_at, version))
    f = order("C-10", path="/v1/refunds")
    task = await held(addon, f)
    ((receipt, expires_at, version),) = told
    assert receipt.operation_id == f.metadata["receipts"]["operation_id"]
    assert 290 < (expires_at - utcnow()).total_seconds() <= 300  # receipts_approval_timeout's default
    assert version == policy_version(addon.rules.operation("shop", "refunds.create"))
    f.resume()
    await asyncio.wait_for(task, deadline(2))
    assert len(told) == 1

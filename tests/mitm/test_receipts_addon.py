"""The addon's hooks: markers, comments, answers, fail-closed paths, options and approvals."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions, http
from mitmproxy.flow import Error
from mitmproxy.test import taddons

from proxy_addon.mitm.flows import MARKERS
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.store import Store
from tests.conftest import deadline
from tests.mitm.conftest import held, order, running, send, unknown


async def test_forwarded_then_succeeded_marks_and_comments(setup):
    addon, _, tmp = setup
    f = order()
    await send(addon, f)
    assert f.response is None  # forwarded
    assert f.marked == MARKERS["submitted"]
    f.response = http.Response.make(201, b'{"order": {"id": "ord_9"}}', {"content-type": "application/json"})
    await addon.response(f)
    assert f.marked == MARKERS["succeeded"]
    assert f.comment == f"succeeded (201) · shop orders.create · receipt {f.metadata['receipts']['operation_id']}"
    r = Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"])
    assert (r.state, r.external_id) == ("succeeded", "ord_9")
    assert f.response.headers["X-Receipt-State"] == "succeeded"


async def test_duplicate_of_unknown_is_blocked_with_marker(setup):
    addon, _, _ = setup
    first = order("B-2")
    await send(addon, first)
    first.error = Error("server closed connection")
    first.server_conn.timestamp_tcp_setup = 1.0
    first.server_conn.timestamp_tls_setup = 1.0
    await addon.error(first)
    assert first.marked == MARKERS["outcome_unknown"]

    dup = order("B-2")
    await send(addon, dup)
    assert dup.response is not None
    assert dup.response.status_code == 409
    body = dup.response.json()
    assert (body["error"], body["state"]) == ("duplicate_unresolved", "outcome_unknown")
    assert dup.marked == MARKERS["blocked"]
    assert dup.comment == f"BLOCKED duplicate · shop orders.create · receipt {body['operation_id']}: outcome_unknown"


async def test_comments_put_the_state_first_and_the_readmes_filters_still_find_them(setup):
    """
    mitmweb's Comment column is narrow (150 px): what the flow came to is first, the operation
    and the receipt after it. docs/mitmweb.md's filters (`~comment BLOCKED`, `~comment receipt`,
    `~comment <id> & !~comment BLOCKED`) still pick the same flows.
    """
    from mitmproxy import flowfilter

    addon, _, _ = setup
    ok = order("S-1")
    await send(addon, ok)
    ok.response = http.Response.make(201, b'{"order": {"id": "ord_1"}}', {"content-type": "application/json"})
    await addon.response(ok)
    replayed = order("S-1")
    await send(addon, replayed)
    lost = await unknown(addon, "S-2")
    blocked = order("S-2")
    await send(addon, blocked)
    ok_id, lost_id = (f.metadata["receipts"]["operation_id"] for f in (ok, lost))
    assert [f.comment for f in (ok, replayed, lost, blocked)] == [
        f"succeeded (201) · shop orders.create · receipt {ok_id}",
        f"REPLAYED · shop orders.create · receipt {ok_id}: succeeded (201)",
        f"outcome_unknown · shop orders.create · receipt {lost_id}",
        f"BLOCKED duplicate · shop orders.create · receipt {lost_id}: outcome_unknown",
    ]
    flows = {"ok": ok, "replayed": replayed, "lost": lost, "blocked": blocked}

    def picked(spec: str) -> list[str]:
        test = flowfilter.parse(spec)
        return [name for name, f in flows.items() if test(f)]

    assert picked("~comment BLOCKED") == ["blocked"]
    assert picked("~comment receipt") == ["ok", "replayed", "lost", "blocked"]
    assert picked(f"~comment {lost_id} & !~comment BLOCKED") == ["lost"]
    assert picked(f"~comment {ok_id} & !~comment BLOCKED") == ["ok", "replayed"]


async def test_error_before_connecting_is_not_sent(setup):
    addon, _, _ = setup
    f = order("C-3")
    await send(addon, f)
    f.error = Error("Connection refused")  # tflow's server_conn: never set up
    f.server_conn.timestamp_tcp_setup = None
    await addon.error(f)
    assert f.metadata["receipts"]["state"] == "not_sent"
    retry = order("C-3")
    await send(addon, retry)
    assert retry.response is None  # forwarded as a new attempt


async def test_unmatched_flow_is_untouched(setup):
    addon, _, _ = setup
    f = order(path="/v1/health")
    await send(addon, f)
    assert "receipts" not in f.metadata
    assert f.response is None and not f.marked and not f.comment


async def test_unconfigured_addon_refuses_everything():
    addon = Receipts()
    with taddons.context(addon):
        f = order()
        await send(addon, f)
        assert f.response is not None
        assert f.response.status_code == 503
        assert f.response.json()["sent"] is False


async def test_internal_error_after_commit_fails_closed(setup, monkeypatch):
    addon, _, tmp = setup

    def broken(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(addon._deadlines, "arm", broken)
    f = order("D-4")
    await send(addon, f)
    assert f.response is not None
    assert f.response.status_code == 503
    assert "boom" in f.response.json()["detail"]
    r = Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"])
    assert r.state == "not_sent"  # committed, then provably not sent


async def test_store_failure_answers_503(setup, monkeypatch):
    addon, _, _ = setup
    from proxy_addon.errors import StoreUnavailable

    def locked(*a, **kw):
        raise StoreUnavailable("cannot write the receipts database: database is locked")

    monkeypatch.setattr(addon.installation.store, "begin_attempt", locked)
    f = order("E-5")
    await send(addon, f)
    assert f.response is not None
    assert f.response.status_code == 503
    assert f.response.json()["error"] == "receipt_store_unavailable"
    assert f.marked == MARKERS["store_unavailable"]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("receipts_upstream_timeout", 0, "must be a positive number"),
        ("receipts_replay_window", -1, "must be a positive number"),
        ("connection_strategy", "eager", "connection_strategy=lazy"),
        ("receipts_rules", "/nonexistent/rules", "no such rules file or folder"),
    ],
    ids=["zero-timeout", "negative-window", "eager", "missing-rules"],
)
def test_bad_options_are_refused(setup, option, value, message):
    addon, tctx, _ = setup
    with pytest.raises(exceptions.OptionsError, match=message):
        tctx.configure(addon, **{option: value})


async def test_approval_gate_approve(setup):
    import asyncio

    addon, _, tmp = setup
    f = order("R-1", path="/v1/refunds")
    task = await held(addon, f)
    assert f.marked == MARKERS["awaiting_approval"]
    assert f.comment.startswith("AWAITING APPROVAL")
    operation_id = f.metadata["receipts"]["operation_id"]
    assert Store.open(tmp / "r.db", create=False).get(operation_id).state == "awaiting_approval"
    dup = order("R-1", path="/v1/refunds")  # a duplicate while it waits is blocked
    await send(addon, dup)
    assert dup.response is not None
    assert (dup.response.status_code, dup.response.json()["state"]) == (409, "awaiting_approval")
    f.resume()
    await asyncio.wait_for(task, 5)
    assert f.response is None  # approved: forwarded
    r = Store.open(tmp / "r.db", create=False)
    assert r.get(operation_id).state == "submitted"
    assert [e.reason for e in r.events(operation_id)][-1] == "approved by operator"


async def test_approval_gate_deny_by_kill(setup):
    import asyncio

    addon, _, tmp = setup
    f = order("R-2", path="/v1/refunds")
    task = await held(addon, f)
    f.kill()
    await asyncio.wait_for(task, 5)
    assert f.error is None and f.live  # un-killed, so the agent gets an answer
    assert f.response is not None
    assert f.response.status_code == 403
    assert (f.response.json()["error"], f.response.json()["reason"]) == ("denied_by_operator", "denied by operator")
    r = Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"])
    assert (r.state, r.error) == ("rejected", "denied by operator")
    retry = order("R-2", path="/v1/refunds")  # a rejected receipt lets a new attempt through, held again
    retry_task = await held(addon, retry)
    retry.kill()
    await asyncio.wait_for(retry_task, 5)


async def test_approval_gate_times_out(setup):
    addon, tctx, tmp = setup
    tctx.configure(addon, receipts_approval_timeout=1)
    f = order("R-3", path="/v1/refunds")
    await send(addon, f)
    assert f.response is not None
    assert f.response.status_code == 403
    assert "no decision within receipts_approval_timeout (1s)" in f.response.json()["reason"]
    assert Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"]).state == "rejected"


# --- a held write is sent as it was recorded, or not at all (issue 17, item 3) -------------------


def _events(tmp, operation_id: str) -> list[tuple[str | None, str, str, str]]:
    return [
        (e.from_state, e.to_state, e.actor, e.reason)
        for e in Store.open(tmp / "r.db", create=False).events(operation_id)
    ]


@pytest.mark.parametrize("edit", ["body", "header", "path", "method"])
async def test_a_held_write_edited_then_resumed_is_denied_and_never_sent(setup, edit):
    """What an operator edits in mitmweb (PUT /flows/<id>, flow.set) before Resume is not what the receipt recorded."""
    import asyncio

    addon, _, tmp = setup
    f = order("R-4", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    f.backup()  # what mitmweb's PUT /flows/<id> does before it edits
    if edit == "body":
        f.request.text = '{"sku": "R-4", "amount": 1000000}'
    elif edit == "header":
        f.request.headers["x-extra"] = "1"
    elif edit == "path":
        f.request.path = "/v1/refunds?amount=1000000"
    else:
        f.request.method = "PUT"
    f.resume()
    await asyncio.wait_for(task, 5)
    # Answered by the proxy: mitmproxy sends no request upstream for a flow that has a response.
    assert f.response is not None and f.response.status_code == 403
    body = f.response.json()
    assert (body["error"], body["sent"], body["state"]) == ("denied_by_operator", False, "rejected")
    assert "modified while held" in body["reason"]
    r = Store.open(tmp / "r.db", create=False).get(operation_id)
    assert r.state == "rejected" and "modified while held" in (r.error or "")
    assert _events(tmp, operation_id)[-1][:3] == ("awaiting_approval", "rejected", "proxy")
    assert "modified while held" in _events(tmp, operation_id)[-1][3]
    assert f.marked == MARKERS["rejected"] and "modified while held" in f.comment
    assert f.metadata["receipts"]["outcome"] == "rejected"  # the response hook records nothing more


async def test_a_held_write_edited_then_reverted_is_sent_as_recorded(setup):
    """mitmweb's Revert puts the request back (and a copy of the flow's metadata): that is no edit."""
    import asyncio

    addon, _, tmp = setup
    f = order("R-5", path="/v1/refunds")
    task = await held(addon, f)
    f.backup()
    f.request.text = '{"sku": "R-5", "amount": 1000000}'
    f.revert()
    f.resume()
    await asyncio.wait_for(task, 5)
    assert f.response is None  # approved: forwarded
    assert f.request.content == b'{"sku": "R-5"}'
    assert f.metadata["receipts"]["state"] == "submitted"
    assert Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"]).state == "submitted"


@pytest.mark.parametrize("then", ["nothing", "resume"])
async def test_a_held_write_whose_agent_hung_up_is_denied_at_once(setup, then):
    """An agent that closed its connection while its write was held: denied, also if an operator resumes it."""
    import asyncio

    from mitmproxy.connection import ConnectionState

    addon, _, tmp = setup
    f = order("R-6", path="/v1/refunds")
    task = await held(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    f.client_conn.state = ConnectionState.CAN_WRITE  # what mitmproxy records when the agent's side closes
    if then == "resume":
        f.resume()
    await asyncio.wait_for(task, deadline(2))  # at once: well within receipts_approval_timeout (300 s)
    assert f.response is not None and f.response.status_code == 403  # never forwarded
    assert f.response.json()["reason"] == "denied: the agent hung up while the write was held"
    r = Store.open(tmp / "r.db", create=False).get(operation_id)
    assert (r.state, r.error) == ("rejected", "denied: the agent hung up while the write was held")
    assert _events(tmp, operation_id)[-1] == (
        "awaiting_approval",
        "rejected",
        "proxy",
        "denied: the agent hung up while the write was held",
    )
    assert f.marked == MARKERS["rejected"]
    assert f.comment.startswith("rejected (denied: the agent hung up while the write was held) · ")


async def test_the_watch_follows_a_resolution_made_elsewhere_without_scanning_the_receipts(setup):
    """mitmweb's once-a-second watch: a receipt resolved by another process (the CLI) updates its flow.
    What it reads is searched by key, never scanned: a scan of a large database each second stalls the proxy."""
    from mitmproxy.addons import view

    from proxy_addon.states import State

    addon, tctx, tmp = setup
    v = view.View()
    tctx.master.addons.add(v)
    watch = tctx.master.addons.get("watch")
    others = [await unknown(addon, f"W-{i}") for i in range(3)]  # changes from before the watch starts
    after = watch.follow_receipts(None)  # from now on
    f = await unknown(addon, "W-9")
    v.add([f, *others])
    assert f.marked == MARKERS["outcome_unknown"]
    cli = Store.open(tmp / "r.db", create=False)
    cli.resolve(f.metadata["receipts"]["operation_id"], State.SUCCEEDED, note="seen in the dashboard", actor="cli")
    cli.close()
    statements: list[str] = []
    addon.reader().conn.set_trace_callback(statements.append)
    try:
        after = watch.follow_receipts(after)
    finally:
        addon.reader().conn.set_trace_callback(None)
    assert f.marked == MARKERS["succeeded"] and f.comment.startswith("succeeded")
    assert all(o.marked == MARKERS["outcome_unknown"] for o in others)  # not refreshed: they did not change
    plans = [row[-1] for sql in statements for row in addon.reader().conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    assert plans and not [p for p in plans if p.startswith("SCAN")], plans
    assert watch.follow_receipts(after) == after  # nothing new


async def test_the_watch_follows_the_new_database_after_receipts_db_changes(setup):
    """Event ids start again in another database: the watch follows it from then on, not from the old one's ids."""
    from mitmproxy.addons import view

    from proxy_addon.states import State

    addon, tctx, tmp = setup
    v = view.View()
    tctx.master.addons.add(v)
    watch = tctx.master.addons.get("watch")
    for i in range(5):
        await unknown(addon, f"OLD-{i}")  # the old database's ids run ahead of the new one's
    after = watch.follow_receipts(watch.follow_receipts(None))
    tctx.configure(addon, receipts_db=str(tmp / "r2.db"), receipts_new_db=True)
    after = watch.follow_receipts(after)  # the new database: from now on
    f = await unknown(addon, "NEW-1")
    v.add([f])
    cli = Store.open(tmp / "r2.db", create=False)
    cli.resolve(f.metadata["receipts"]["operation_id"], State.SUCCEEDED, note="checked", actor="cli")
    cli.close()
    watch.follow_receipts(after)
    assert f.marked == MARKERS["succeeded"] and f.comment.startswith("succeeded")


async def test_a_held_write_keeps_awaiting_approval_in_its_comment(setup):
    """The watch refreshes flows from their receipts every second: a held one keeps its AWAITING APPROVAL comment."""
    import asyncio

    from mitmproxy import flowfilter
    from mitmproxy.addons import view

    addon, tctx, _ = setup
    v = view.View()
    tctx.master.addons.add(v)
    watch = tctx.master.addons.get("watch")
    f = order("R-7", path="/v1/refunds")
    v.add([f])
    task = await held(addon, f)
    held_id = f.metadata["receipts"]["operation_id"]
    dup = order("R-7", path="/v1/refunds")
    await send(addon, dup)  # blocked: its comment names awaiting_approval, it is not held
    v.add([dup])
    assert watch.follow_receipts(0) > 0  # it refreshed the held flow
    assert f.comment == f"AWAITING APPROVAL (resume to send, kill to deny) · shop refunds.create · receipt {held_id}"
    assert f.marked == MARKERS["awaiting_approval"]
    held_filter = flowfilter.parse('~comment "AWAITING APPROVAL"')
    assert [x for x in (f, dup) if held_filter(x)] == [f]
    f.kill()
    await asyncio.wait_for(task, 5)
    watch.follow_receipts(0)
    assert f.comment == f"rejected (denied by operator) · shop refunds.create · receipt {held_id}"
    assert not held_filter(f)


async def test_an_edit_made_while_the_approval_is_committed_is_not_sent(setup):
    """Resumed, then edited before the request leaves (the flow is no longer held): sent as recorded and approved."""
    import asyncio

    addon, _, tmp = setup
    real = addon.calls

    async def calls(fn):  # the edit lands while the approval is written to the store
        f.request.text = '{"sku": "R-8", "amount": 1000000}'
        return await real(fn)

    f = order("R-8", path="/v1/refunds")
    addon.calls = calls  # what the approval gate writes its decision with
    try:
        task = await held(addon, f)
        f.resume()
        await asyncio.wait_for(task, 5)
    finally:
        addon.calls = real
    assert f.response is None  # approved: forwarded...
    assert f.request.content == b'{"sku": "R-8"}'  # ...as recorded
    assert Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"]).state == "submitted"


async def test_refusals_are_counted_by_reason(setup):
    """receipt_proxy_refused_total: matched writes the proxy answered itself and never sent."""
    addon, tctx, _ = setup

    def refused(reason: str) -> float | None:
        labels = {"api": "shop", "operation": "orders.create", "reason": reason}
        return addon.metrics.registry.get_sample_value("receipt_proxy_refused_total", labels)

    bad = order("R-1")
    bad.request.headers["X-Note"] = "one\r\ntwo"  # no HTTP client can send this field: 400, never sent
    await send(addon, bad)
    assert bad.response is not None
    assert bad.response.status_code == 400 and bad.response.json()["error"] == "bad_header"
    assert refused("bad_header") == 1
    ok = order("R-2")
    await send(addon, ok)
    assert ok.response is None  # forwarded: not a refusal
    tctx.configure(addon, receipts_body_cap=8)
    big = order("R-3")
    await send(addon, big)
    assert big.response is not None
    assert big.response.status_code == 413
    assert refused("body_too_large") == 1 and refused("bad_header") == 1


async def test_the_flows_a_drain_tracks_stay_bounded_while_answered_ones_are_dropped(setup):
    import gc

    from proxy_addon.mitm.drain import PRUNE_AT

    addon, _, _ = setup
    for i in range(5 * PRUNE_AT):
        f = order(f"D-{i}")
        await send(addon, f)
        f.response = http.Response.make(201, b"{}", {"content-type": "application/json"})
        await addon.response(f)
        f.live = False  # answered: mitmproxy is done with it
    assert len(addon.drain._flows) <= 2 * PRUNE_AT
    del f
    gc.collect()
    assert len(addon.drain._flows) == 0  # answered flows nobody else holds are not kept alive by the drain
    assert addon.drain.in_flight() == 0


KEYED_RULES = """\
api: shop
hosts: [api.shop.test]
operations:
  pay.create:
    match: {method: POST, path: /v1/pay}
    fingerprint: {body: [sku]}
    idempotency_key: {header: Idempotency-Key}
"""


async def test_the_receipts_key_replaces_the_agents_header_and_a_retry_carries_the_first_key(tmp_path):
    """receipts_forward=mitmproxy: the request mitmproxy sends carries the receipt's key, in place
    of the agent's (one field, however many it sent); the retry after an unknown outcome, with the
    agent's new key, carries the first attempt's; the answer says which key went."""
    async with running(tmp_path, KEYED_RULES) as (addon, _):
        first = order("P-1", "/v1/pay")
        first.request.headers.add("Idempotency-Key", "agent-1")
        first.request.headers.add("idempotency-key", "agent-1b")
        await send(addon, first)
        key = f"receipt-{first.metadata['receipts']['operation_id']}"
        assert first.request.headers.get_all("Idempotency-Key") == [key]
        first.error = Error("server closed connection")
        first.server_conn.timestamp_tcp_setup = first.server_conn.timestamp_tls_setup = 1.0
        await addon.error(first)

        retry = order("P-1", "/v1/pay")
        retry.request.headers["Idempotency-Key"] = "agent-2"
        await send(addon, retry)  # the key dedupes (no ttl): safe_to_retry, then sent
        assert retry.response is None
        assert retry.metadata["receipts"]["retry_of"] == first.metadata["receipts"]["operation_id"]
        assert retry.request.headers.get_all("Idempotency-Key") == [key]
        retry.response = http.Response.make(201, b"{}", {"content-type": "application/json"})
        await addon.response(retry)
        assert retry.response.headers["X-Receipt-Idempotency-Key"] == key

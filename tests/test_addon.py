"""The addon's hooks with mitmproxy's own test helpers (taddons, tflow): no sockets."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions, http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow

from proxy_addon.addon import Receipts
from proxy_addon.answers import MARKERS
from proxy_addon.store import Store

RULES = """\
api: shop
hosts: [api.shop.test]
operations:
  orders.create:
    match: {method: POST, path: /v1/orders}
    fingerprint: {body: [sku]}
    external_id: order.id
  refunds.create:
    match: {method: POST, path: /v1/refunds}
    fingerprint: {body: [sku]}
    approve: true
"""


@pytest.fixture
async def setup(tmp_path):
    rules = tmp_path / "shop.yaml"
    rules.write_text(RULES)
    addon = Receipts()
    with taddons.context() as tctx:
        tctx.options.add_option("connection_strategy", str, "eager", "as the proxyserver addon declares it")
        tctx.master.addons.add(addon)  # load() switches it to lazy
        tctx.configure(addon, receipts_db=str(tmp_path / "r.db"), receipts_rules=str(rules),
                       receipts_watch_rules=False, receipts_forward="mitmproxy")
        yield addon, tctx, tmp_path
        await addon.done()


def order(sku: str = "A-1", path: str = "/v1/orders") -> http.HTTPFlow:
    f = tflow.tflow()
    f.request = http.Request.make("POST", f"https://api.shop.test{path}", f'{{"sku": "{sku}"}}',
                                  {"content-type": "application/json", "authorization": "Bearer t0k3n"})
    f.response = None
    return f


async def send(addon: Receipts, f: http.HTTPFlow) -> None:
    addon.requestheaders(f)
    await addon.request(f)


async def test_forwarded_then_succeeded_marks_and_comments(setup):
    addon, _, tmp = setup
    f = order()
    await send(addon, f)
    assert f.response is None  # forwarded
    assert f.marked == MARKERS["submitted"]
    f.response = http.Response.make(201, b'{"order": {"id": "ord_9"}}', {"content-type": "application/json"})
    await addon.response(f)
    assert f.marked == MARKERS["succeeded"]
    assert "shop orders.create · succeeded (201)" in f.comment
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
    assert dup.response.status_code == 409
    body = dup.response.json()
    assert (body["error"], body["state"]) == ("duplicate_unresolved", "outcome_unknown")
    assert dup.marked == MARKERS["blocked"]
    assert dup.comment.startswith(f"BLOCKED duplicate of receipt {body['operation_id']}")


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
        assert f.response.status_code == 503
        assert f.response.json()["sent"] is False


async def test_internal_error_after_commit_fails_closed(setup, monkeypatch):
    addon, _, tmp = setup

    def broken(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(addon, "_arm_deadline", broken)
    f = order("D-4")
    await send(addon, f)
    assert f.response.status_code == 503
    assert "boom" in f.response.json()["detail"]
    r = Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"])
    assert r.state == "not_sent"  # committed, then provably not sent


async def test_store_failure_answers_503(setup, monkeypatch):
    addon, _, _ = setup
    from proxy_addon.errors import StoreUnavailable

    def locked(*a, **kw):
        raise StoreUnavailable("cannot write the receipts database: database is locked")

    monkeypatch.setattr(addon.store, "begin_attempt", locked)
    f = order("E-5")
    await send(addon, f)
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


async def held(addon: Receipts, f: http.HTTPFlow):
    """Send `f` and return the request hook's task once the approval gate holds the flow."""
    import asyncio

    addon.requestheaders(f)
    task = asyncio.create_task(addon.request(f))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if f.intercepted:
            break
    assert f.intercepted, "the flow was not held for approval"
    return task


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
    assert f.response.status_code == 403
    assert "no decision within receipts_approval_timeout (1s)" in f.response.json()["reason"]
    assert Store.open(tmp / "r.db", create=False).get(f.metadata["receipts"]["operation_id"]).state == "rejected"


async def unknown(addon, sku: str) -> http.HTTPFlow:
    f = order(sku)
    await send(addon, f)
    f.error = Error("server closed connection")
    f.server_conn.timestamp_tcp_setup = f.server_conn.timestamp_tls_setup = 1.0
    await addon.error(f)
    return f


async def test_receipt_content_view(setup):
    from mitmproxy import contentviews

    addon, _, _ = setup
    first = await unknown(addon, "V-1")
    dup = order("V-1")
    await send(addon, dup)
    original = first.metadata["receipts"]["operation_id"]
    shown = contentviews.prettify_message(dup.response, dup)  # chosen by itself for the proxy's answer
    assert shown.view_name == "Receipt"
    assert f"BLOCKED: a duplicate of receipt {original} (now outcome_unknown)" in shown.text
    assert "submitted → outcome_unknown" in shown.text and "blocked duplicate" in shown.text
    assert '"sku": "V-1"' in shown.text and "t0k3n" not in shown.text
    mine = contentviews.prettify_message(first.request, first, view_name="Receipt")
    assert mine.text.startswith(f"receipt          {original}")
    assert contentviews.prettify_message(first.request, first).view_name != "Receipt"  # by choice for forwarded flows


async def test_commands_show_resolve_and_refuse(setup):
    from mitmproxy import exceptions

    addon, _, tmp = setup
    f = await unknown(addon, "C-1")
    assert "state            outcome_unknown" in addon.show(f)
    assert addon.resolve_flow(f, "safe_to_retry", "not on the dashboard") == (
        f"receipt {f.metadata['receipts']['operation_id']} is now safe_to_retry")
    r = Store.open(tmp / "r.db", create=False).events(f.metadata["receipts"]["operation_id"])
    assert [(e.to_state, e.actor) for e in r[-2:]] == [("manual_review", "mitmweb operator"), ("safe_to_retry", "mitmweb operator")]
    with pytest.raises(exceptions.CommandError, match="only outcome_unknown and manual_review"):
        addon.resolve_flow(f, "succeeded", "again")
    with pytest.raises(exceptions.CommandError, match="resolve as one of"):
        addon.resolve_flow(await unknown(addon, "C-2"), "maybe", "x")
    with pytest.raises(exceptions.CommandError, match="no receipt"):
        addon.show(order(path="/v1/health"))


async def test_reconcile_command_without_a_spec_goes_to_manual_review(setup):
    import asyncio

    addon, _, tmp = setup
    f = await unknown(addon, "C-3")
    assert addon.reconcile_flow(f).startswith("reconciling receipt")
    store = Store.open(tmp / "r.db", create=False)
    for _ in range(100):
        await asyncio.sleep(0.02)
        if store.get(f.metadata["receipts"]["operation_id"]).state == "manual_review":
            break
    events = store.events(f.metadata["receipts"]["operation_id"])
    assert events[-1].to_state == "manual_review"
    assert events[-1].actor == "mitmweb operator (receipts.reconcile)"


async def test_the_original_flow_comment_follows_its_receipt(setup):
    from mitmproxy.addons import view

    addon, tctx, _ = setup
    v = view.View()
    tctx.master.addons.add(v)
    first = await unknown(addon, "U-1")
    v.add([first])
    assert first.comment.endswith("outcome_unknown") and first.marked == MARKERS["outcome_unknown"]
    dup = order("U-1")
    await send(addon, dup)
    addon.resolve_flow(dup, "succeeded", "the order exists")  # resolved from the duplicate's flow
    assert first.comment.endswith("· succeeded")
    assert first.marked == MARKERS["succeeded"]


@pytest.mark.parametrize("state", ["submitted", "succeeded", "rejected", "not_sent", "outcome_unknown",
                                   "reconciling", "manual_review", "safe_to_retry"])
async def test_receipt_view_for_each_state(setup, state):
    from mitmproxy import contentviews

    from proxy_addon.states import State

    addon, _, tmp = setup
    f = order(f"S-{state}")
    await send(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    store = Store.open(tmp / "r.db")
    walk = {"submitted": [], "succeeded": ["succeeded"], "rejected": ["rejected"], "not_sent": ["not_sent"],
            "outcome_unknown": ["outcome_unknown"], "reconciling": ["outcome_unknown", "reconciling"],
            "manual_review": ["outcome_unknown", "manual_review"],
            "safe_to_retry": ["outcome_unknown", "reconciling", "safe_to_retry"]}[state]
    for step in walk:
        store.transition(operation_id, State(step), reason=f"to {step}", actor="test")
    text = contentviews.prettify_message(f.request, f, view_name="Receipt").text
    assert f"state            {state}\n" in text
    assert text.count("\n  20") == len(walk) + 1  # one history line per transition, the first included
    assert "BLOCKED" not in text

"""The Receipt content view mitmweb shows."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.flow import Error

from proxy_addon.mitm.flows import MARKERS
from proxy_addon.store import Store
from tests.mitm.conftest import order, send, unknown


async def test_receipt_content_view(setup):
    from mitmproxy import contentviews

    addon, _, _ = setup
    first = await unknown(addon, "V-1")
    dup = order("V-1")
    await send(addon, dup)
    original = first.metadata["receipts"]["operation_id"]
    assert dup.response is not None
    shown = contentviews.prettify_message(dup.response, dup)  # chosen by itself for the proxy's answer
    assert shown.view_name == "Receipt"
    assert f"BLOCKED: a duplicate of receipt {original} (now outcome_unknown)" in shown.text
    assert "submitted → outcome_unknown" in shown.text and "blocked duplicate" in shown.text
    assert '"sku": "V-1"' in shown.text and "t0k3n" not in shown.text
    mine = contentviews.prettify_message(first.request, first, view_name="Receipt")
    assert mine.text.startswith(f"receipt          {original}")
    assert contentviews.prettify_message(first.request, first).view_name != "Receipt"  # by choice for forwarded flows


@pytest.mark.parametrize(
    "state",
    [
        "submitted",
        "succeeded",
        "rejected",
        "not_sent",
        "outcome_unknown",
        "reconciling",
        "manual_review",
        "safe_to_retry",
    ],
)
async def test_receipt_view_for_each_state(setup, state):
    from mitmproxy import contentviews

    from proxy_addon.states import State

    addon, _, tmp = setup
    f = order(f"S-{state}")
    await send(addon, f)
    operation_id = f.metadata["receipts"]["operation_id"]
    store = Store.open(tmp / "r.db")
    walk = {
        "submitted": [],
        "succeeded": ["succeeded"],
        "rejected": ["rejected"],
        "not_sent": ["not_sent"],
        "outcome_unknown": ["outcome_unknown"],
        "reconciling": ["outcome_unknown", "reconciling"],
        "manual_review": ["outcome_unknown", "manual_review"],
        "safe_to_retry": ["outcome_unknown", "reconciling", "safe_to_retry"],
    }[state]
    for step in walk:
        store.transition(operation_id, State(step), reason=f"to {step}", actor="test")
    text = contentviews.prettify_message(f.request, f, view_name="Receipt").text
    assert f"state            {state}\n" in text
    history = text.split("\ndecisions", 1)[0]
    assert history.count("\n  20") == len(walk) + 1  # one history line per transition, the first included
    assert "BLOCKED" not in text


MCP_RULES = """\
api: tracker
hosts: [mcp.tracker.test]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title]}
"""


def tool_call(title: str, call_id: int) -> http.HTTPFlow:
    import json

    from mitmproxy.test import tflow

    f = tflow.tflow()
    body = {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": "create_issue", "arguments": {"title": title}},
    }
    headers: dict[str | bytes, str | bytes] = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-session-id": "sess-SECRET-1",
        "authorization": "Bearer t0k3n",
    }
    f.request = http.Request.make("POST", "https://mcp.tracker.test/mcp", json.dumps(body), headers)
    f.response = None
    return f


async def test_mcp_receipts_show_in_mitmweb_like_any_other(tmp_path):
    """Marker, comment with the tool, the proxy's answer as a tool result, and the Receipt view's tool line."""
    import json

    from mitmproxy import contentviews

    from tests.mitm.conftest import running

    async with running(tmp_path, MCP_RULES) as (addon, _):
        first = tool_call("Printer on fire", 1)
        await send(addon, first)
        assert first.response is None and first.marked == MARKERS["submitted"]
        first.error = Error("server closed connection")
        first.server_conn.timestamp_tcp_setup = first.server_conn.timestamp_tls_setup = 1.0
        await addon.error(first)
        receipt = first.metadata["receipts"]["operation_id"]
        assert first.marked == MARKERS["outcome_unknown"]
        assert first.comment == f"outcome_unknown · tracker issues.create (tool create_issue) · receipt {receipt}"

        dup = tool_call("Printer on fire", 2)
        await send(addon, dup)
        assert dup.marked == MARKERS["blocked"]
        assert dup.comment.startswith("BLOCKED duplicate · tracker issues.create (tool create_issue)")
        assert dup.response is not None and dup.response.content is not None
        assert dup.response.status_code == 200
        answer = json.loads(dup.response.content)
        assert answer["id"] == 2 and answer["result"]["isError"] is True
        assert receipt in answer["result"]["content"][0]["text"]
        shown = contentviews.prettify_message(dup.response, dup)
        assert shown.view_name == "Receipt"
        assert "MCP tool call: create_issue(title)" in shown.text
        assert '"params.arguments.title": "Printer on fire"' in shown.text
        assert "sess-SECRET-1" not in shown.text and "t0k3n" not in shown.text
        stored = Store.open(tmp_path / "r.db", create=False)
        assert "sess-SECRET-1" not in json.dumps(stored.get(receipt).intent)
        stored.close()


DECIDED_RULES = """\
api: shop
hosts: [api.shop.test]
operations:
  orders.create:
    match: {method: POST, path: /v1/orders}
    fingerprint: {body: [sku]}
    decisions:
      - deny: {sku: {in: [NO-1]}}
        reason: no such skus
  refunds.create:
    match: {method: POST, path: /v1/refunds}
    fingerprint: {body: [sku]}
    approve: true
  vouchers.create:
    match: {method: POST, path: /v1/vouchers}
    fingerprint: {body: [sku]}
    budget: {window: 366d, count: 1}
"""


def decisions_shown(f: http.HTTPFlow) -> list[str]:
    """The Receipt view's decisions section, a line each (its time cut off), as mitmproxy renders it."""
    from mitmproxy import contentviews

    text = contentviews.prettify_message(f.request, f, view_name="Receipt").text
    section = text.split("\ndecisions:", 1)[1]
    if section.startswith(" none"):
        return []
    return [" ".join(line.split()[1:]) for line in section.strip("\n").splitlines()]


async def test_the_receipt_view_shows_the_decisions_applied_and_who_made_them(tmp_path):
    """A rule's deny, a budget's refusal, an approval from the CLI, an abort in mitmweb, a timeout: each
    in the view's decisions, with who decided; a write sent with no decision says none."""
    import asyncio

    from proxy_addon.mitm import approval
    from tests.conftest import deadline
    from tests.mitm.conftest import held, running

    async with running(tmp_path, DECIDED_RULES) as (addon, tctx):
        plain, denied = order("A-1"), order("NO-1")
        voucher, over = order("V-1", path="/v1/vouchers"), order("V-2", path="/v1/vouchers")
        for f in (plain, denied, voucher, over):
            await send(addon, f)
        assert denied.response is not None and denied.response.status_code == 403
        assert over.response is not None and over.response.status_code == 429
        assert decisions_shown(plain) == decisions_shown(voucher) == []
        assert decisions_shown(denied) == ["denied by a rule's decision, never sent proxy"]
        assert decisions_shown(over) == ["refused: over budget, never sent proxy"]

        approved = order("R-1", path="/v1/refunds")
        task = await held(addon, approved)
        store = Store.open(tmp_path / "r.db", create=False)
        store.decide_approval(approved.metadata["receipts"]["operation_id"], approve=True, note="", actor="cli:alice")
        store.close()
        await asyncio.wait_for(task, deadline(10 * approval.POLL))
        assert decisions_shown(approved) == [
            "held for approval proxy",
            "approved by alice at the command line cli:alice",
        ]

        aborted = order("R-2", path="/v1/refunds")
        task = await held(addon, aborted)
        aborted.kill()
        await asyncio.wait_for(task, deadline(5))
        assert decisions_shown(aborted) == ["held for approval proxy", "denied in mitmweb mitmweb"]

        tctx.configure(addon, receipts_approval_timeout=1)
        timed_out = order("R-3", path="/v1/refunds")
        await send(addon, timed_out)
        assert decisions_shown(timed_out) == [
            "held for approval proxy",
            "denied: no decision within the approval timeout proxy",
        ]

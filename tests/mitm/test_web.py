"""The Receipt content view mitmweb shows."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions, http
from mitmproxy.flow import Error
from mitmproxy.test import taddons

from proxy_addon.mitm.addon import Receipts
from proxy_addon.mitm.flows import MARKERS
from proxy_addon.store import Store
from tests.mitm.conftest import held, order, send, unknown


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

"""The receipts.* commands."""

from __future__ import annotations

import pytest

from proxy_addon.mitm.flows import MARKERS
from proxy_addon.store import Store
from tests.mitm.conftest import order, send, unknown


async def test_commands_show_resolve_and_refuse(setup):
    from mitmproxy import exceptions

    addon, tctx, tmp = setup
    f = await unknown(addon, "C-1")
    assert "state            outcome_unknown" in tctx.commands.show(f)
    assert tctx.commands.resolve_flow(f, "safe_to_retry", "not on the dashboard") == (
        f"receipt {f.metadata['receipts']['operation_id']} is now safe_to_retry"
    )
    r = Store.open(tmp / "r.db", create=False).events(f.metadata["receipts"]["operation_id"])
    assert [(e.to_state, e.actor) for e in r[-2:]] == [
        ("manual_review", "mitmweb operator"),
        ("safe_to_retry", "mitmweb operator"),
    ]
    with pytest.raises(exceptions.CommandError, match="only outcome_unknown and manual_review"):
        tctx.commands.resolve_flow(f, "succeeded", "again")
    with pytest.raises(exceptions.CommandError, match="resolve as one of"):
        tctx.commands.resolve_flow(await unknown(addon, "C-2"), "maybe", "x")
    with pytest.raises(exceptions.CommandError, match="no receipt"):
        tctx.commands.show(order(path="/v1/health"))


async def test_reconcile_command_without_a_spec_goes_to_manual_review(setup):
    import asyncio

    addon, tctx, tmp = setup
    f = await unknown(addon, "C-3")
    assert tctx.commands.reconcile_flow(f).startswith("reconciling receipt")
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
    assert first.comment.startswith("outcome_unknown · ") and first.marked == MARKERS["outcome_unknown"]
    dup = order("U-1")
    await send(addon, dup)
    tctx.commands.resolve_flow(dup, "succeeded", "the order exists")  # resolved from the duplicate's flow
    assert first.comment.startswith("succeeded · ")
    assert first.marked == MARKERS["succeeded"]

"""
The approval gate (`approve: true` in a rule): a write waits in mitmweb for an operator.

The request is held with mitmproxy's own intercept until an operator resumes it (approve:
the receipt becomes submitted and the request is sent) or kills it (deny: rejected, "denied
by operator"), or until receipts_approval_timeout passes (denied too). The agent gets a 403
that says so when denied. The wait holds no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from mitmproxy import ctx, hooks, http
from mitmproxy.flow import Error

from proxy_addon import answers
from proxy_addon.gate import StoreThread
from proxy_addon.mitm.flows import mark, response_of
from proxy_addon.states import State
from proxy_addon.store import Receipt

logger = logging.getLogger(__name__)

HELD = "AWAITING APPROVAL (resume to send, kill to deny): "


def _killed(flow: http.HTTPFlow) -> bool:
    return flow.error is not None and flow.error.msg == Error.KILLED_MESSAGE


async def _decision(flow: http.HTTPFlow, timeout: float) -> tuple[State, str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while flow.intercepted and not _killed(flow) and loop.time() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(flow.wait_for_resume(), 0.25)
    if not flow.intercepted and not _killed(flow):
        return State.SUBMITTED, "approved by operator"
    if _killed(flow):
        return State.REJECTED, "denied by operator"
    return State.REJECTED, f"denied: no decision within receipts_approval_timeout ({timeout:g}s)"


async def await_approval(
    flow: http.HTTPFlow, meta: dict, receipt: Receipt, calls: StoreThread, timeout: float
) -> Receipt:
    """Hold the flow until an operator decides; the receipt after the decision (submitted: send it)."""
    flow.intercept()
    mark(flow, State.AWAITING_APPROVAL, receipt, prefix=HELD)
    ctx.master.addons.trigger(hooks.UpdateHook([flow]))
    logger.warning(f"receipt {receipt.operation_id} {receipt.api} {receipt.operation}: awaiting approval in mitmweb")
    to, reason = await _decision(flow, timeout)
    actor = "mitmweb operator" if "operator" in reason else "proxy"
    fields = {} if to is State.SUBMITTED else {"error": reason}
    receipt = await calls(
        lambda s: s.transition(
            receipt.operation_id,
            to,
            reason=reason,
            actor=actor,
            expect=[State.AWAITING_APPROVAL],
            flow_id=flow.id,
            **fields,
        )
    )
    meta["state"] = str(receipt.state)
    mark(flow, receipt.state, receipt)
    if to is not State.SUBMITTED:
        meta["outcome"], meta["answer"] = str(to), "denied"
        # Answer the agent even when the flow was killed: undo the kill, send a 403 that says why.
        flow.error, flow.live, flow.intercepted = None, True, False
        flow.response = response_of(answers.denied(receipt, reason))
        logger.warning(f"receipt {receipt.operation_id}: {reason}")
    return receipt

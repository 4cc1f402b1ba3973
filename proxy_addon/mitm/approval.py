"""
The approval gate (`approve: true` in a rule): a write waits in mitmweb for an operator.

The request is held with mitmproxy's own intercept until an operator resumes it (approve:
the receipt becomes submitted and the request is sent) or kills it (deny: rejected, "denied
by operator"), or until receipts_approval_timeout passes (denied too). The agent gets a 403
that says so when denied. The wait holds no thread.

A held write is sent as it was recorded, or not at all:
- mitmweb lets an operator edit a held flow (`PUT /flows/<id>`, the command bar's `flow.set`).
  What goes upstream (method, URL, headers, body, trailers) is taken when the flow is held and
  compared when it is resumed: a write edited while held is denied ("modified while held"),
  since its receipt, fingerprint and duplicate check are the original's. An edit undone
  (mitmweb's Revert) before the resume is no edit. We compare the request itself rather than
  trust `flow.modified()`: mitmweb backs a flow up on any edit, a comment or a marker too, and
  our own markers change the flow after that backup.
- An agent that hangs up while its write is held (its connection closed, as mitmproxy sees it:
  `client_conn.connected` is false) gets its write denied at once ("the agent hung up while the
  write was held"), also when an operator resumes it later: nobody would get the answer. An
  HTTP/2 stream reset on a connection that stays open is not seen: the timeout or an operator
  decides that write.
- mitmweb's "Resume all" resumes every held flow, each one approved as if resumed by itself.
The flow's comment keeps `AWAITING APPROVAL` while it is held (flows.comment), and says why a
denied write was denied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from mitmproxy import ctx, hooks, http
from mitmproxy.flow import Error

from proxy_addon import answers
from proxy_addon.gate import StoreThread
from proxy_addon.metrics import Metrics
from proxy_addon.mitm.flows import HELD, META, mark, response_of
from proxy_addon.states import State
from proxy_addon.store import Receipt

logger = logging.getLogger(__name__)

MODIFIED = "denied: the request was modified while held (resume it unedited, or revert it first)"
HUNG_UP = "denied: the agent hung up while the write was held"
DENIED = "denied by operator"
OPERATOR = "mitmweb operator"

_TIMES = ("timestamp_start", "timestamp_end")  # when it arrived: not part of what is sent


def _sent_form(req: http.Request) -> dict[str, Any]:
    """What of a request goes upstream: all of it (target, version, headers, body, trailers) but its timestamps."""
    state = req.get_state()
    for k in _TIMES:
        state.pop(k, None)
    return state


def _killed(flow: http.HTTPFlow) -> bool:
    return flow.error is not None and flow.error.msg == Error.KILLED_MESSAGE


def _gone(flow: http.HTTPFlow) -> bool:
    return not flow.client_conn.connected


async def _decision(flow: http.HTTPFlow, held_as: dict[str, Any], timeout: float) -> tuple[State, str, str]:
    """Wait for the decision: (the receipt's next state, why, who decided)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while flow.intercepted and not _killed(flow) and not _gone(flow) and loop.time() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(flow.wait_for_resume(), 0.25)
    if _killed(flow):
        return State.REJECTED, DENIED, OPERATOR
    if _gone(flow):  # before a resume is taken: nobody would get the answer
        return State.REJECTED, HUNG_UP, "proxy"
    if not flow.intercepted:
        if _sent_form(flow.request) != held_as:
            return State.REJECTED, MODIFIED, "proxy"
        return State.SUBMITTED, "approved by operator", OPERATOR
    return State.REJECTED, f"denied: no decision within receipts_approval_timeout ({timeout:g}s)", "proxy"


def decision_label(to: State, reason: str) -> str:
    """The `decision` label of receipt_proxy_approval_decisions_total."""
    if to is State.SUBMITTED:
        return "approved"
    return {DENIED: "denied", MODIFIED: "modified", HUNG_UP: "hung_up"}.get(reason, "timeout")


async def await_approval(
    flow: http.HTTPFlow, meta: dict, receipt: Receipt, calls: StoreThread, timeout: float, *, metrics: Metrics
) -> Receipt:
    """Hold the flow until an operator decides; the receipt after the decision (submitted: send it)."""
    held_as = _sent_form(flow.request)  # what the receipt recorded: sent so, or not at all
    flow.intercept()
    mark(flow, State.AWAITING_APPROVAL, receipt, prefix=HELD)
    ctx.master.addons.trigger(hooks.UpdateHook([flow]))
    logger.warning(f"receipt {receipt.operation_id} {receipt.api} {receipt.operation}: awaiting approval in mitmweb")
    metrics.held(receipt.api, receipt.operation, 1)
    try:
        to, reason, actor = await _decision(flow, held_as, timeout)
    except asyncio.CancelledError:  # the proxy stops (drain.py records not_sent)
        metrics.decided(receipt.api, receipt.operation, "stopped")
        raise
    finally:
        metrics.held(receipt.api, receipt.operation, -1)
    metrics.decided(receipt.api, receipt.operation, decision_label(to, reason))
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
    if flow.metadata.get(META) is not meta:  # mitmweb's Revert put back a copy of the flow's metadata
        flow.metadata[META] = meta
    meta["state"] = str(receipt.state)
    if receipt.state is State.SUBMITTED and _sent_form(flow.request) != held_as:
        # Edited after the resume, while the approval was being committed: the flow is no longer
        # held, and what was recorded and approved is what is sent.
        flow.request.set_state({**flow.request.get_state(), **held_as})
        logger.warning(f"receipt {receipt.operation_id}: an edit made after the approval was undone; sent as recorded")
    mark(flow, receipt.state, receipt)
    if to is not State.SUBMITTED:
        meta["outcome"], meta["answer"] = str(to), "denied"
        # Answer the agent even when the flow was killed: undo the kill, send a 403 that says why.
        flow.error, flow.live, flow.intercepted = None, True, False
        flow.response = response_of(answers.denied(receipt, reason))
        logger.warning(f"receipt {receipt.operation_id}: {reason}")
    ctx.master.addons.trigger(hooks.UpdateHook([flow]))
    return receipt

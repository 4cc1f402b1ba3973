"""
A forwarded write's outcome, recorded: its receipt's transition through the gate, and what the
flow shows of it (its marker and comment; on an upstream answer, the X-Receipt-* headers: the
receipt's id and state, and the idempotency key the write was sent with).

    receipt = await record.outcome(gate, metrics, flow, meta, outcome, op)   # None: the store refused it
    await record.answer(gate, metrics, flow, meta, op, cap=..., complete=...)

`answer` classifies the answer in `flow.response` first (forward.outcome_of).
"""

from __future__ import annotations

import dataclasses
import time

from mitmproxy import http

from proxy_addon.gate.admission import Gate
from proxy_addon.gate.metrics import Metrics
from proxy_addon.mitm import forward
from proxy_addon.mitm.flows import headers_of, mark, show_key
from proxy_addon.outcome.classify import Outcome
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import Receipt
from proxy_addon.wire.redaction import credentials_from

__all__ = ["answer", "of_round", "outcome"]


def of_round(meta: dict, result: Outcome) -> Outcome:
    """
    The outcome of what was sent, as its receipt takes it: the next round of an MCP call whose
    server asked for input (store/rounds.py: `meta["round"]`) that never left is no proof that
    nothing left, for its earlier rounds did: outcome_unknown, not not_sent.
    """
    if result.state is not State.NOT_SENT or not meta.get("round"):
        return result
    why = (
        f"{result.reason}; but this was round {meta['round']} of a call whose earlier rounds were sent (its server "
        "asked for input): whether one acted is unknown"
    )
    return dataclasses.replace(result, state=State.OUTCOME_UNKNOWN, reason=why, error=why)


async def outcome(
    gate: Gate, metrics: Metrics, flow: http.HTTPFlow, meta: dict, result: Outcome, op: Operation | None = None
) -> Receipt | None:
    """Record a forwarded request's outcome through the gate, and show it on the flow."""
    result = of_round(meta, result)
    meta["outcome"] = str(result.state)
    meta["reason"] = result.reason  # as its event records it: a span's receipt.reason, a JSON log line's
    if (sent_at := meta.pop("sent_at", None)) is not None:
        parent = gate.spans.traceparent(flow.id) if gate.spans is not None else None  # OpenTelemetry on
        trace_id = parent.split("-")[1] if parent else None  # 00-{trace id}-{span id}-{flags}
        metrics.exchanged(meta["api"], meta["operation"], time.monotonic() - sent_at, trace_id)
    receipt = await gate.record(
        meta["operation_id"],
        result,
        flow_id=flow.id,
        op=op,
        # only an answer that says the effect may exist is reconciled at once, with them
        credentials=credentials_from(op.credential_headers, headers_of(flow.request))
        if op is not None and result.evidence
        else None,
    )
    if receipt is None:
        flow.comment = f"NOT RECORDED as {result.state}: the store refused it · receipt {meta['operation_id']}"
        return None
    meta["state"] = str(receipt.state)
    mark(flow, receipt.state, receipt)
    return receipt


async def answer(
    gate: Gate, metrics: Metrics, flow: http.HTTPFlow, meta: dict, op: Operation | None, *, cap: int, complete: bool
) -> None:
    """
    Classify and record the answer in `flow.response`. Its body, decoded, is read up to `cap`
    (receipts_response_cap); past that (or when `complete` is False: only its first bytes are
    there) the outcome comes from the status and headers, and the recorded answer is truncated.
    """
    resp = flow.response
    assert resp is not None
    meta["upstream_status"] = resp.status_code
    call = meta.get("mcp") or {}
    result = forward.outcome_of(
        resp, op, cap=cap, complete=complete, call_id=call.get("id"), task_call=bool(call.get("task"))
    )
    receipt = await outcome(gate, metrics, flow, meta, result, op)
    if receipt is not None and result.evidence and receipt.external_id:
        resp.headers["X-Receipt-External-Id"] = receipt.external_id
    resp.headers["X-Receipt-Id"] = meta["operation_id"]
    resp.headers["X-Receipt-State"] = meta["state"]
    show_key(resp, meta)

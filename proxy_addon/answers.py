"""
What the agent and mitmweb see: the proxy's own answers, markers and comments.

Every answer the proxy makes instead of the upstream is JSON an agent can read, with
`X-Receipt-Id` and `X-Receipt-State` headers; pure functions of a receipt, so they are
tested without a proxy.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from mitmproxy import http

from proxy_addon.states import State
from proxy_addon.store import Receipt, RecordedResponse

MARKERS: dict[Any, str] = {  # mitmweb shows `:emoji_name:` markers (mitmproxy.utils.emoji)
    State.AWAITING_APPROVAL: ":pause_button:",
    State.SUBMITTED: ":outbox_tray:",
    State.SUCCEEDED: ":white_check_mark:",
    State.REJECTED: ":x:",
    State.NOT_SENT: ":leftwards_arrow_with_hook:",
    State.OUTCOME_UNKNOWN: ":warning:",
    State.RECONCILING: ":hourglass:",
    State.SAFE_TO_RETRY: ":arrows_counterclockwise:",
    State.MANUAL_REVIEW: ":raised_hand:",
    "blocked": ":no_entry:",
    "replayed": ":recycle:",
    "store_unavailable": ":stop_sign:",
}

HINTS = {
    State.AWAITING_APPROVAL: "the first attempt is waiting for an operator's approval in mitmweb",
    State.SUBMITTED: "the first attempt is still in flight; wait for its outcome before retrying",
    State.OUTCOME_UNKNOWN: "the first attempt's outcome is unknown; reconcile it before retrying",
    State.RECONCILING: "the first attempt is being reconciled; retry after it settles",
    State.MANUAL_REVIEW: "the first attempt needs manual review; resolve it with the receipts CLI before retrying",
}

# Response headers never recorded for replay: credentials, per-connection framing, and
# content-encoding (the body is recorded decoded).
UNRECORDED_HEADERS = frozenset(
    {"set-cookie", "set-cookie2", "authorization", "proxy-authenticate", "www-authenticate",
     "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
     "upgrade", "proxy-connection", "trailer", "te", "alt-svc"}
)


def receipt_headers(receipt: Receipt) -> dict[str, str]:
    return {"X-Receipt-Id": receipt.operation_id, "X-Receipt-State": str(receipt.state)}


def json_response(status: int, body: dict, headers: dict[str, str]) -> http.Response:
    return http.Response.make(
        status, json.dumps(body, indent=2) + "\n",
        {"Content-Type": "application/json", "Cache-Control": "no-store", **headers},
    )


def comment(receipt: Receipt, prefix: str = "") -> str:
    """The flow comment mitmweb shows: `receipt ID · api operation · state (status)`."""
    detail = f" ({receipt.http_status})" if receipt.http_status else ""
    retry = f" · retry of {receipt.retry_of}" if receipt.retry_of and not prefix else ""
    return f"{prefix}receipt {receipt.operation_id} · {receipt.api} {receipt.operation} · {receipt.state}{detail}{retry}"


def duplicate(receipt: Receipt, kind: str, *, retry_after: dt.datetime | None = None) -> http.Response:
    """
    The answer to a duplicate that is not forwarded: `blocked`, `blocked_succeeded` or
    `key_conflict`. `retry_after`: when a read can next prove the first attempt absent (settle).
    """
    base = {"operation_id": receipt.operation_id, "api": receipt.api, "operation": receipt.operation}
    if kind == "key_conflict":
        return json_response(422, {
            "error": "idempotency_key_reused", **base,
            "hint": "this Idempotency-Key was already used for a different request; use a new key for a new request",
        }, receipt_headers(receipt))
    if kind == "blocked_succeeded":
        return json_response(409, {
            "error": "duplicate_succeeded", **base, "state": str(receipt.state),
            "external_id": receipt.external_id, "completed_at": receipt.completed_at,
            "hint": "this operation already succeeded; it was not sent again",
        }, receipt_headers(receipt))
    doc = {
        "error": "duplicate_unresolved", **base, "state": str(receipt.state),
        "submitted_at": receipt.submitted_at,
        "hint": HINTS.get(receipt.state, "the first attempt is unresolved"),
    }
    headers = receipt_headers(receipt)
    if retry_after is not None:
        doc["retry_after"] = retry_after.isoformat().replace("+00:00", "Z")
        doc["hint"] = (f"the first attempt's outcome is unknown and this API's read proves absence only after a delay; "
                       f"send it again after {doc['retry_after']} to have it reconciled")
        headers["Retry-After"] = str(max(1, math.ceil((retry_after - dt.datetime.now(dt.UTC)).total_seconds())))
    return json_response(409, doc, headers)


def replay(receipt: Receipt) -> http.Response:
    """The recorded response of a succeeded receipt, marked as a replay."""
    rec = receipt.response
    assert rec is not None
    resp = http.Response.make(rec.status, rec.body)
    resp.headers = http.Headers(
        [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in rec.headers]
    )
    resp.headers["content-length"] = str(len(rec.body))
    resp.headers["X-Receipt-Replayed"] = "true"
    for k, v in receipt_headers(receipt).items():
        resp.headers[k] = v
    return resp


def unavailable(api: str, operation: str, why: str) -> http.Response:
    return json_response(503, {
        "error": "receipt_store_unavailable", "sent": False, "api": api, "operation": operation, "detail": why,
        "hint": "the request was not sent upstream; it is safe to retry once the receipts database is writable",
    }, {"Retry-After": "5"})


def exchange_failed(operation_id: str, state: State, detail: str, *, timed_out: bool) -> http.Response:
    """The answer when the upstream exchange broke: `state` is not_sent or outcome_unknown."""
    sent = state is not State.NOT_SENT
    return json_response(504 if timed_out else 502, {
        "error": "outcome_unknown" if sent else "not_sent",
        "operation_id": operation_id, "state": str(state), "detail": detail,
        "hint": "the request may have taken effect; do not resend it until the receipt is reconciled"
        if sent else "the request never reached the upstream; it is safe to send again",
    }, {"X-Receipt-Id": operation_id, "X-Receipt-State": str(state)})


def recorded(resp: http.Response, cap: int) -> tuple[RecordedResponse, bytes]:
    """What is kept of an upstream response for replay (body up to `cap`), and its whole decoded body."""
    body = resp.get_content(strict=False) or b""
    return RecordedResponse(
        status=resp.status_code,
        headers=[(k, v) for k, v in resp.headers.items(multi=True) if k.lower() not in UNRECORDED_HEADERS],
        body=body[:cap],
        truncated=len(body) > cap,
    ), body


def denied(receipt: Receipt, reason: str) -> http.Response:
    """The answer when an operator denies a held request, or nobody decided in time."""
    return json_response(403, {
        "error": "denied_by_operator", "operation_id": receipt.operation_id, "api": receipt.api,
        "operation": receipt.operation, "state": str(receipt.state), "reason": reason, "sent": False,
        "hint": "the request was not sent; ask the operator before trying it again",
    }, receipt_headers(receipt))

"""
What the agent gets when the proxy answers instead of the upstream.

Every such answer is JSON an agent can read, with `X-Receipt-Id` and `X-Receipt-State`
headers. These are pure functions of a receipt, returning an `Answer` (status, headers,
body) that the mitmproxy layer turns into a response; they are tested without a proxy.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

from proxy_addon.states import State
from proxy_addon.store import Receipt, RecordedResponse

HINTS = {
    State.AWAITING_APPROVAL: "the first attempt is waiting for an operator's approval (mitmweb, receipts approve)",
    State.SUBMITTED: "the first attempt is still in flight; wait for its outcome before retrying",
    State.OUTCOME_UNKNOWN: "the first attempt's outcome is unknown; reconcile it before retrying",
    State.RECONCILING: "the first attempt is being reconciled; retry after it settles",
    State.MANUAL_REVIEW: "the first attempt needs manual review; resolve it with the receipts CLI before retrying",
}

# Response headers never recorded for replay: credentials, per-connection framing, and
# content-encoding (the body is recorded decoded).
UNRECORDED_HEADERS = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "authorization",
        "proxy-authenticate",
        "www-authenticate",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "upgrade",
        "proxy-connection",
        "trailer",
        "te",
        "alt-svc",
        "mcp-session-id",  # an MCP session is the first client's: never replayed into another
    }
)


@dataclass(frozen=True)
class Answer:
    """A response the proxy makes itself. Header names and values are str (surrogate-escaped bytes allowed)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    doc: dict | None = None  # the proxy's own JSON, which error_envelopes.py wraps in the API's; None: a replay


def receipt_headers(receipt: Receipt) -> dict[str, str]:
    return {"X-Receipt-Id": receipt.operation_id, "X-Receipt-State": str(receipt.state)}


def json_answer(status: int, body: dict, headers: dict[str, str]) -> Answer:
    content = (json.dumps(body, indent=2) + "\n").encode()
    fields = {
        "Content-Type": "application/json",
        "Cache-Control": "no-store",
        **headers,
        "content-length": str(len(content)),
    }
    return Answer(status, tuple(fields.items()), content, body)


def duplicate(
    receipt: Receipt,
    kind: str,
    *,
    retry_after: dt.datetime | None = None,
    now: dt.datetime | None = None,
    task_id: str | None = None,
    note: str | None = None,
) -> Answer:
    """
    The answer to a duplicate that is not forwarded: `blocked`, `blocked_succeeded` or
    `key_conflict`. `retry_after`: when the proxy will next read to settle the first attempt
    (after a failed read's Retry-After or backoff, or when a read can prove it absent: once the
    original can no longer land, and after settle). A first attempt that waits for its client's
    input or for its task (an MCP tool call: store/rounds.py) says so (`waiting_for`), with the
    task's id for its own caller (`task_id`); `note`: why this attempt was refused, when the
    receipt's state does not say it (the server asked for input too often).
    """
    base = {"operation_id": receipt.operation_id, "api": receipt.api, "operation": receipt.operation}
    if kind == "key_conflict":
        return _key_reused(receipt, base)
    if kind == "blocked_succeeded":
        return _already_succeeded(receipt, base)
    doc: dict[str, object] = {
        "error": "duplicate_unresolved",
        **base,
        "state": str(receipt.state),
        "submitted_at": receipt.submitted_at,
        "hint": HINTS.get(receipt.state, "the first attempt is unresolved"),
    }
    _waiting_for(doc, receipt, task_id)
    if note is not None:
        doc.update(detail=note, hint="the first attempt did not complete; reconcile it before retrying")
    headers = receipt_headers(receipt)
    if retry_after is not None:
        doc["retry_after"] = retry_after.isoformat().replace("+00:00", "Z")
        doc["hint"] = _read_again_hint(receipt, str(doc["retry_after"]))
        wait = (retry_after - (now or dt.datetime.now(dt.UTC))).total_seconds()
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
    return json_answer(409, doc, headers)


def _key_reused(receipt: Receipt, base: dict[str, str]) -> Answer:
    """422: the agent's own Idempotency-Key, already used for a different request."""
    return json_answer(
        422,
        {
            "error": "idempotency_key_reused",
            **base,
            "hint": "this Idempotency-Key was already used for a different request; use a new key for a new request",
        },
        receipt_headers(receipt),
    )


def _already_succeeded(receipt: Receipt, base: dict[str, str]) -> Answer:
    """409 duplicate_succeeded: the operation succeeded, and its answer is not replayed (or may not be)."""
    return json_answer(
        409,
        {
            "error": "duplicate_succeeded",
            **base,
            "state": str(receipt.state),
            "external_id": receipt.external_id,
            "completed_at": receipt.completed_at,
            "hint": "this operation already succeeded; it was not sent again",
        },
        receipt_headers(receipt),
    )


def _waiting_for(doc: dict[str, object], receipt: Receipt, task_id: str | None) -> None:
    """A submitted first attempt that waits for its client's input or for its task says so (an MCP tool call)."""
    if receipt.state is State.SUBMITTED and receipt.waiting_for == "input":
        doc.update(waiting_for="input", rounds=receipt.mcp_rounds)
        doc["hint"] = (
            "the first attempt waits for the input its server asked for (input_required); it goes on when its "
            "client sends that input, and an identical new request is not sent meanwhile"
        )
    elif receipt.state is State.SUBMITTED and receipt.waiting_for == "task":
        doc.update(waiting_for="task", task_status=receipt.task_status)
        if task_id is not None:
            doc["task_id"] = task_id
        doc["hint"] = "the server runs the first attempt as a task that has not ended; poll the task for its result"


def _read_again_hint(receipt: Receipt, retry_after: str) -> str:
    """What a duplicate is told when the proxy reads again only at `retry_after`, and why then."""
    if receipt.failed_reads:
        reads = "read" if receipt.failed_reads == 1 else "reads"
        return (
            f"the first attempt's outcome is unknown and {receipt.failed_reads} {reads} to settle it failed; "
            f"send it again after {retry_after} to have it read again; sooner, it is answered "
            "409 without a read"
        )
    if receipt.completed_at is None:  # taken over from a proxy that went silent (reconcile/judge.py, landed_by)
        return (
            "the first attempt's outcome is unknown and its request may still land (its proxy stopped while it "
            f"was in flight); send it again after {retry_after} to have it reconciled"
        )
    return (
        f"the first attempt's outcome is unknown and this API's read proves absence only after a delay; "
        f"send it again after {retry_after} to have it reconciled"
    )


def replay(receipt: Receipt, rec: RecordedResponse) -> Answer:
    """The recorded response of a succeeded receipt (opened from its seal: Decision.answer), marked as a replay."""
    ours = receipt_headers(receipt)
    replaced = {"content-length", "x-receipt-replayed", *(h.lower() for h in ours)}
    headers = [(k, v) for k, v in rec.headers if k.lower() not in replaced]
    headers += [
        ("content-length", str(len(rec.body))),
        ("X-Receipt-Replayed", "true"),
        *ours.items(),
    ]
    return Answer(rec.status, tuple(headers), rec.body)


def unavailable(api: str, operation: str, why: str) -> Answer:
    return json_answer(
        503,
        {
            "error": "receipt_store_unavailable",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": why,
            "hint": "the request was not sent upstream; it is safe to retry once the receipts database is writable",
        },
        {"Retry-After": "5"},
    )


def exchange_failed(operation_id: str, state: State, detail: str, *, timed_out: bool) -> Answer:
    """The answer when the upstream exchange broke: `state` is not_sent or outcome_unknown."""
    sent = state is not State.NOT_SENT
    return json_answer(
        504 if timed_out else 502,
        {
            "error": "outcome_unknown" if sent else "not_sent",
            "operation_id": operation_id,
            "state": str(state),
            "detail": detail,
            "hint": "the request may have taken effect; do not resend it until the receipt is reconciled"
            if sent
            else "the request never reached the upstream; it is safe to send again",
        },
        {"X-Receipt-Id": operation_id, "X-Receipt-State": str(state)},
    )


def body_refused(api: str, operation: str, *, too_large: bool, detail: str) -> Answer:
    """
    A matched write refused for its body before any receipt: 413 when it is, or decodes to,
    more than receipts_body_cap; 400 when its Content-Encoding cannot be decoded. Nothing was sent.
    """
    if too_large:
        error = "request_body_too_large"
        hint = (
            "the request was not sent and no receipt was recorded; send a smaller body, "
            "or raise the proxy's receipts_body_cap (--set receipts_body_cap=BYTES)"
        )
    else:
        error = "bad_content_encoding"
        hint = (
            "the request was not sent and no receipt was recorded; send the body plain, "
            "or with a Content-Encoding the proxy decodes (gzip, deflate, br, zstd)"
        )
    return json_answer(
        413 if too_large else 400,
        {"error": error, "sent": False, "api": api, "operation": operation, "detail": detail, "hint": hint},
        {},
    )


def bad_header(api: str, operation: str, header: str, problem: str) -> Answer:
    """
    A matched write refused before any receipt because a header field cannot be sent
    (fields.bad_field: an obs-fold line, a CR, LF or NUL, a name that is not a token).
    Names the header, never its value (it may be a credential). Nothing was sent.
    """
    return json_answer(
        400,
        {
            "error": "bad_header",
            "sent": False,
            "api": api,
            "operation": operation,
            "header": header,
            "detail": f"the request's {header} header {problem}",
            "hint": "the request was not sent and no receipt was recorded; send that header as one line, its name "
            "an HTTP token and its value without CR, LF, NUL or other control characters, then send the request again",
        },
        {},
    )


def undecodable_header(api: str, operation: str, header: str) -> Answer:
    """
    A matched write refused before any receipt because a header the proxy reads as text (one the
    fingerprint names, a credential, the idempotency key) is not UTF-8: a Latin-1 byte, an encoded
    surrogate. Servers decode such bytes differently. Names the header, never its value. Nothing was sent.
    """
    return json_answer(
        400,
        {
            "error": "undecodable_header",
            "sent": False,
            "api": api,
            "operation": operation,
            "header": header,
            "detail": f"the request's {header} header is not UTF-8 text",
            "hint": "the request was not sent and no receipt was recorded; send that header's value as UTF-8 "
            "(or ASCII) text, then send the request again",
        },
        {},
    )


def unpaired_surrogate(api: str, operation: str, detail: str) -> Answer:
    """A matched write refused before any receipt: text entering its intent is no Unicode (errors.UnpairedSurrogate)."""
    return json_answer(
        400,
        {
            "error": "unpaired_surrogate",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": detail,
            "hint": "the request was not sent and no receipt was recorded; send the text with its surrogate pairs "
            "whole (or the character itself, UTF-8 encoded), then send the request again",
        },
        {},
    )


def ambiguous_target(api: str, operation: str, detail: str) -> Answer:
    """
    A matched write refused before any receipt because servers read its request target differently
    (a fragment, `;` path parameters: RuleSet.match) and one reading is a write. Nothing was sent.
    """
    return json_answer(
        400,
        {
            "error": "ambiguous_request_target",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": detail,
            "hint": "the request was not sent and no receipt was recorded; send it without a fragment (#...) and "
            "without path parameters (;...), a ';' that belongs in a path value percent-encoded as %3B",
        },
        {},
    )


def method_override_refused(api: str, operation: str, detail: str) -> Answer:
    """
    A matched write refused before any receipt for its method override headers (RuleSet.match):
    they name different methods, or the rule says the API does not take them. Nothing was sent.
    """
    return json_answer(
        400,
        {
            "error": "method_override_refused",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": detail,
            "hint": "the request was not sent and no receipt was recorded; send it with the method it means in the "
            "request line and without X-HTTP-Method-Override, X-HTTP-Method and X-Method-Override",
        },
        {},
    )


def bad_json(api: str, operation: str, detail: str) -> Answer:
    """
    A matched write refused before any receipt because servers read its JSON body in more than
    one way (wire/json_body.py): a key twice in one object; on an MCP or GraphQL endpoint also a body
    that is not strict UTF-8 JSON, or keys that differ only by case. `detail` names the key and
    where it is, never a value. Nothing was sent.
    """
    return json_answer(
        400,
        {
            "error": "bad_json",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": detail,
            "hint": "the request was not sent and no receipt was recorded; send the body as UTF-8 JSON with each key "
            "once in every object, spelled as the API spells it, then send the request again",
        },
        {},
    )


def response_not_passed(
    operation_id: str,
    state: State,
    status: int,
    why: str,
    *,
    received: int,
    limit: int,
    timeout: float,
    detail: str = "",
) -> Answer:
    """
    The answer when the upstream's answer to a write reached the proxy but could not be passed
    on whole: it is larger than receipts_response_max (`why` "too_large"), it was still arriving
    at the deadline ("timeout"), or it broke off ("broken"). The outcome was recorded from the
    status before the rest was read, so the agent learns it here.
    """
    if why == "too_large":
        error, detail = (
            "response_too_large",
            f"the upstream answered HTTP {status} with a body larger than receipts_response_max ({limit} bytes); "
            "the proxy holds a matched write's answer to record it, so it ended the exchange "
            f"after {received} bytes",
        )
    elif why == "timeout":
        error, detail = (
            "response_incomplete",
            f"the upstream answered HTTP {status}, and its body was still arriving after receipts_upstream_timeout "
            f"({timeout:g}s, {received} bytes)",
        )
    else:
        error, detail = (
            "response_incomplete",
            f"the upstream answered HTTP {status}, and its body broke off after {received} bytes"
            + (f" ({detail})" if detail else ""),
        )
    return json_answer(
        504 if why == "timeout" else 502,
        {
            "error": error,
            "operation_id": operation_id,
            "state": str(state),
            "upstream_status": status,
            "detail": detail,
            "hint": f"the request was sent once, and its outcome was recorded from the status as {state}; "
            + (
                "it may be sent again once corrected"
                if state is State.REJECTED
                else "do not resend it: a duplicate is answered from that receipt"
            )
            + (" (raise receipts_response_max to receive answers this large)" if why == "too_large" else ""),
        },
        {"X-Receipt-Id": operation_id, "X-Receipt-State": str(state)},
    )


def denied(receipt: Receipt, reason: str) -> Answer:
    """The answer when an operator denies a held request, or nobody decided in time."""
    return json_answer(
        403,
        {
            "error": "denied_by_operator",
            "operation_id": receipt.operation_id,
            "api": receipt.api,
            "operation": receipt.operation,
            "state": str(receipt.state),
            "reason": reason,
            "sent": False,
            "hint": "the request was not sent; ask the operator before trying it again",
        },
        receipt_headers(receipt),
    )


def over_budget(receipt: Receipt, reason: str, retry_after: int) -> Answer:
    """
    A write past one of its operation's budgets (store/budgets.py): 429 with Retry-After, the
    seconds until the full budget's window turns; its receipt rejected, nothing sent, no share taken.
    """
    headers = receipt_headers(receipt)
    headers["Retry-After"] = str(retry_after)
    return json_answer(
        429,
        {
            "error": "budget_exceeded",
            "operation_id": receipt.operation_id,
            "api": receipt.api,
            "operation": receipt.operation,
            "state": str(receipt.state),
            "sent": False,
            "retry_after_seconds": retry_after,
            "detail": reason,
            "hint": f"the write was not sent: its budget is used up until its window turns, in {retry_after} s; "
            "send it again after that, or ask the operator to raise the budget",
        },
        headers,
    )


def uncountable(api: str, operation: str, detail: str) -> Answer:
    """A write a budget sums a field of, with no number there (errors.UncountableWrite): 400, no receipt, not sent."""
    return json_answer(
        400,
        {
            "error": "budget_uncountable",
            "sent": False,
            "api": api,
            "operation": operation,
            "detail": detail,
            "hint": "the request was not sent and no receipt was recorded; send the field the budget sums as a "
            "number of 0 or more, then send the request again",
        },
        {},
    )


def recorded(status: int, headers: Iterable[tuple[str, str]], body: bytes, cap: int) -> RecordedResponse:
    """
    What is kept of an upstream answer for replay: its headers but credentials and framing,
    its decoded body up to `cap`.
    """
    return RecordedResponse(
        status=status,
        headers=[(k, v) for k, v in headers if k.lower() not in UNRECORDED_HEADERS],
        body=body[:cap],
        truncated=len(body) > cap,
    )

"""
A flow and its receipt: what a flow carries (`flow.metadata["receipts"]`), how mitmweb shows
it (a marker and a comment per state), and turning the proxy's own answers into responses.
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import ctx, hooks, http
from mitmproxy import flow as mflow
from mitmproxy.net.http import status_codes

from proxy_addon.intent.fingerprint import RequestView
from proxy_addon.outcome import error_envelopes
from proxy_addon.outcome import tool_answers as mcp_answers
from proxy_addon.outcome.http_answers import Answer
from proxy_addon.states import State
from proxy_addon.store import Receipt
from proxy_addon.wire.mcp_calls import ToolCall
from proxy_addon.wire.terminal import escape_controls

META = "receipts"  # flow.metadata key: a plain, serializable dict

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
    "refused": ":no_entry_sign:",  # not sent for its body (receipts_body_cap, a Content-Encoding it cannot decode)
}


HELD = "AWAITING APPROVAL (resume to send, kill to deny)"  # a held write's comment (`~comment "AWAITING APPROVAL"`)


def comment(receipt: Receipt, prefix: str = "") -> str:
    """
    The flow comment mitmweb shows, its state first (the Comment column is narrow):
    `succeeded (201) · dev.to articles.create · receipt ID`. A flow the proxy answered itself
    says so first, and the state of the receipt it was answered from after its id:
    `BLOCKED duplicate · dev.to articles.create · receipt ID: outcome_unknown`. A receipt
    awaiting approval keeps the HELD prefix, whoever refreshes the comment; a write rejected
    without an answer (the approval gate denied it) says why instead of a status.
    """
    if receipt.http_status:
        state = f"{receipt.state} ({receipt.http_status})"
    elif receipt.state == State.REJECTED and receipt.error:
        state = f"{receipt.state} ({receipt.error})"
    else:
        state = str(receipt.state)
    tool = receipt.intent.get("tool") if isinstance(receipt.intent, dict) else None
    named = f" (tool {escape_controls(str(tool))[:64]})" if tool else ""  # an MCP tool call
    what = f"{receipt.api} {receipt.operation}{named} · receipt {receipt.operation_id}"
    if prefix == HELD or (not prefix and receipt.state == State.AWAITING_APPROVAL):
        return f"{HELD} · {what}"
    if prefix:
        return f"{prefix} · {what}: {state}"
    retry = f" · retry of {receipt.retry_of}" if receipt.retry_of else ""
    return f"{state} · {what}{retry}"


def mark(f: mflow.Flow, marker_key: Any, receipt: Receipt, prefix: str = "") -> None:
    f.marked = MARKERS[marker_key]
    f.comment = comment(receipt, prefix) + stale_rules(f)


def stale_rules(f: mflow.Flow) -> str:
    """What a flow matched while the rules on disk did not load says at the end of its comment (watch.py)."""
    where = (f.metadata.get(META) or {}).get("rules_problem")
    return f" · on the last good rules: {where} did not load (see the event log)" if where else ""


def meta_of(f: mflow.Flow | None) -> dict | None:
    """A flow's receipt metadata, when it has a receipt."""
    meta = f.metadata.get(META) if f is not None else None
    return meta if meta and "operation_id" in meta else None


def headers_of(message: http.Message) -> dict[str, str]:
    """
    A message's headers with lower-case names, a repeated one's values joined with ", " (as
    mitmproxy's `headers[name]`). Read from the raw fields in one pass: `headers.items()` looks
    each name up again among all the fields.
    """
    grouped: dict[bytes, list[bytes]] = {}
    for name, value in message.headers.fields:
        key = name.lower()
        if (values := grouped.get(key)) is None:
            grouped[key] = [name, value]
        else:
            values.append(value)
    return {
        _text(values[0]).lower(): _text(values[1]) if len(values) == 2 else ", ".join(map(_text, values[1:]))
        for values in grouped.values()
    }


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")  # as mitmproxy's Headers give a field as str


def request_view(req: http.Request, body: bytes | None = None) -> RequestView:
    """What the fingerprint reads of a request; `body`: its body with the Content-Encoding decoded (wire/bodies.py)."""
    return RequestView(
        method=req.method,
        scheme=req.scheme,
        host=req.host,
        port=req.port,
        path=req.path,
        headers=headers_of(req),
        body=(req.raw_content or b"") if body is None else body,
        sent=req.raw_content if body is not None and req.raw_content is not body else None,  # scheme 1 read it as sent
    )


def response_of(answer: Answer) -> http.Response:
    """The proxy's own answer as a mitmproxy response; the body is sent as it is."""
    fields = [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in answer.headers]
    now = time.time()
    # Built whole, as Response.make would leave it once its headers and body were replaced;
    # content-length included in the headers: the answer's framing as built.
    reason = status_codes.RESPONSES.get(answer.status, "").encode()
    return http.Response(b"HTTP/1.1", answer.status, reason, http.Headers(fields), answer.body, None, now, now)


def refresh(receipt: Receipt) -> None:
    """Keep the original flow's comment and marker in step with its receipt while mitmweb shows it."""
    view = ctx.master.addons.get("view")
    f = view.get_by_id(receipt.flow_id) if view is not None and receipt.flow_id else None
    if f is None:
        return
    if META in f.metadata:
        f.metadata[META]["state"] = str(receipt.state)
    mark(f, receipt.state, receipt)
    ctx.master.addons.trigger(hooks.UpdateHook([f]))


def answer(flow: http.HTTPFlow, given: Answer) -> None:
    """
    The proxy's own answer to a matched request. An MCP tool call gets it as a tool result the
    model reads, under its own JSON-RPC id and in its framing (outcome/tool_answers.py); any other
    request in its API's error envelope, the rules file's `errors:` (outcome/error_envelopes.py).
    """
    meta = flow.metadata.get(META)
    if meta is not None and "mcp" in meta:
        given = mcp_answers.as_tool_answer(given, ToolCall(**meta["mcp"]), meta.get("accept"))
    elif meta is not None:
        given = error_envelopes.in_envelope(given, meta.get("errors", "plain"))
    flow.response = response_of(given)
    show_key(flow.response, meta)


def show_key(resp: http.Response, meta: dict | None) -> None:
    """
    Tell the agent which idempotency key its write went upstream with (X-Receipt-Idempotency-Key):
    the receipt's, which replaced any the agent sent (forward.add_key). Only on a forwarded write.
    """
    key = (meta or {}).get("idempotency_key")
    if key:
        resp.headers["X-Receipt-Idempotency-Key"] = key


def refuse(flow: http.HTTPFlow, meta: dict, given: Answer, kind: str, why: str, *, marker: str = "refused") -> None:
    """Answer a matched request that is not sent: the proxy's answer, its kind in the metadata, the flow marked."""
    answer(flow, given)
    meta["answer"] = kind
    flow.marked = MARKERS[marker]
    flow.comment = f"NOT SENT: {why}"

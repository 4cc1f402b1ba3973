"""
A matched write's span, from the flow's side: begun in `request` once the request is known to be a
write, ended in `response` or `error` (mitm/receipts_addon.py); its attributes picked from the flow
and its receipt metadata. OpenTelemetry itself is gate/receipt_spans.py, loaded only when it is on
(receipts_otel, OTEL_EXPORTER_OTLP_*): while it is off the addon holds None instead of a FlowSpans,
and no hook does more than test for it.

What a span says (and never: the intent's named fields, a tool call's arguments, the URL's path or
query, any header but the trace context; each can carry a secret):
- HTTP (the semantic conventions' server span): `http.request.method`, `server.address`,
  `server.port`, `url.scheme`, `http.response.status_code` (what the agent got), `error.type`;
- an MCP tool call (the MCP conventions): `mcp.method.name` (tools/call), `gen_ai.tool.name`,
  `jsonrpc.request.id`, `gen_ai.operation.name` (execute_tool);
- the receipt: `receipt.id`, `receipt.api`, `receipt.operation`, `receipt.state`, `receipt.fingerprint`
  (its first 16 hex digits), `receipt.answer` (forward, blocked, replay, ...), `receipt.sent`,
  `receipt.reason` (the outcome's, as its event records it), `receipt.upstream_status`; a duplicate:
  `receipt.duplicate` (blocked / replayed) and `receipt.matched` (the receipt it was answered from), and a
  link to that receipt's own span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mitmproxy import http

from proxy_addon.mitm.flows import META
from proxy_addon.store import Decision

if TYPE_CHECKING:
    from proxy_addon.gate.receipt_spans import ReceiptSpans

__all__ = ["FINGERPRINT_SHOWN", "FlowSpans", "span_name"]

FINGERPRINT_SHOWN = 16  # hex digits of the intent's fingerprint a span carries: enough to find the receipt
REASON_SHOWN = 500  # characters of an outcome's reason


def span_name(meta: dict, method: str) -> str:
    """`tools/call create_issue` (MCP: {mcp.method.name} {target}), else `POST things.create` (method, operation)."""
    call = meta.get("mcp") or {}
    if call.get("name"):
        return f"tools/call {call['name']}"
    return f"{method} {meta['api']}.{meta['operation']}"


class FlowSpans:
    """The spans of the flows a proxy matched (gate/receipt_spans.py does the OpenTelemetry part)."""

    def __init__(self, spans: ReceiptSpans, *, endpoint: str = "") -> None:
        self.spans = spans
        self.endpoint = endpoint  # the receipts_otel value it was made for (mitm/tracing.py)

    def begin(self, flow: http.HTTPFlow, meta: dict) -> object:
        """Start a matched write's span, under the agent's traceparent if it sent one; the token to detach."""
        req = flow.request
        attributes: dict[str, Any] = {
            "http.request.method": req.method,
            "server.address": req.host,
            "server.port": req.port,
            "url.scheme": req.scheme,
            "network.protocol.version": req.http_version.removeprefix("HTTP/"),
            "receipt.api": meta["api"],
            "receipt.operation": meta["operation"],
        }
        call = meta.get("mcp") or {}
        if call.get("name"):
            attributes.update(
                {
                    "mcp.method.name": "tools/call",
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": str(call["name"]),
                }
            )
            if call.get("id") is not None:
                attributes["jsonrpc.request.id"] = str(call["id"])
        headers = {k: v for k in ("traceparent", "tracestate") if (v := req.headers.get(k)) is not None}
        return self.spans.begin(flow.id, span_name(meta, req.method), headers, attributes)

    def detach(self, token: object) -> None:
        self.spans.detach(token)

    def trace_parent(self, flow: http.HTTPFlow) -> str | None:
        return self.spans.traceparent(flow.id)

    def admitted(self, flow: http.HTTPFlow, decision: Decision) -> None:
        """What the gate decided: the receipt, and for a duplicate the receipt it matched (linked)."""
        r = decision.receipt
        attributes: dict[str, Any] = {
            "receipt.id": r.operation_id,
            "receipt.fingerprint": r.intent_fingerprint.partition(":")[2][:FINGERPRINT_SHOWN],
            "receipt.answer": decision.kind,
        }
        link = None
        if decision.kind not in ("forward", "denied", "over_budget"):  # answered from an earlier receipt
            attributes["receipt.duplicate"] = "replayed" if decision.kind == "replay" else "blocked"
            attributes["receipt.matched"] = r.operation_id
            link = r.trace_parent
        self.spans.annotate(flow.id, attributes, link=link)

    def inject(self, flow: http.HTTPFlow) -> None:
        """The forwarded request carries the proxy span's context (traceparent, tracestate)."""
        self.spans.inject(flow.id, flow.request.headers)  # mitmproxy Headers: a MutableMapping[str, str]

    def end(self, flow: http.HTTPFlow) -> None:
        """End the flow's span (response, error hooks) with what its receipt came to and what the agent got."""
        if not self.spans.is_open(flow.id):
            return
        meta = flow.metadata.get(META) or {}
        attributes: dict[str, Any] = {}
        for key, name in (("operation_id", "receipt.id"), ("state", "receipt.state"), ("answer", "receipt.answer")):
            if meta.get(key) is not None:
                attributes[name] = str(meta[key])
        if meta.get("reason"):
            attributes["receipt.reason"] = str(meta["reason"])[:REASON_SHOWN]
        if meta.get("upstream_status") is not None:
            attributes["receipt.upstream_status"] = int(meta["upstream_status"])
        if meta.get("answer") == "forward":
            attributes["receipt.sent"] = bool(meta.get("sent")) and meta.get("outcome") != "not_sent"
        error = None
        if flow.response is not None:
            status = flow.response.status_code
            attributes["http.response.status_code"] = status
            if status >= 500:
                attributes["error.type"] = str(status)
                error = str(meta.get("state") or status)
        elif flow.error is not None:
            attributes["error.type"] = "connection_error" if flow.error.msg != "killed" else "killed"
            error = attributes["error.type"]
        self.spans.end(flow.id, attributes, error=error)

    def close(self) -> None:
        self.spans.close()

"""
OpenTelemetry spans of receipts: one per matched request, its children, and linked spans for what
changes a receipt later. Imported only when OpenTelemetry is on (gate/otel_setup.py): this is the one
module of the package that imports opentelemetry, and nothing imports it while it is off.

    spans = ReceiptSpans(otel_setup.provider(endpoint, service="receipt-proxy"))
    token = spans.begin(flow_id, name, headers, attributes)   # the agent's traceparent, if any, is its parent
    ... spans.inject(flow_id, forwarded_headers)               # the upstream sees the proxy span's context
    with spans.child("receipt.reconcile", {...}) as child: ... # under the current span (contextvars)
    spans.end(flow_id, attributes, error=None)
    with spans.child("receipt.reconcile", {...}, link=receipt.trace_parent): ...   # the CLI: a linked root

Trace context is W3C Trace Context only (traceparent, tracestate), read and written by the SDK's
own propagator; baggage is neither read nor forwarded (it may carry anything). A span's
attributes are what the caller gives (mitm/flow_spans.py picks them: never the intent's named
fields, never a credential).

Later changes are linked spans, not span events: the write's span ended when the agent was
answered, and an ended span takes no event (the SDK drops it, and a backend has exported it
already). A reconcile from the CLI, a person's resolution, a lease expiry are each a unit of work
of their own, with their own duration and outcome; a link (to `Receipt.trace_parent`) lets a
trace viewer go from either span to the other. What happens while the request is still open (an
approval wait, a reconcile read on the request's behalf) is a child span instead, and a person's
decision on a held write an event of its approval wait.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["MAX_OPEN", "ReceiptSpans", "traceparent_of"]

MAX_OPEN = 10_000  # spans of flows not ended yet; past it the oldest is ended ("abandoned"): memory stays bounded
W3C = TraceContextTextMapPropagator()
Attributes = Mapping[str, str | int | bool]


def traceparent_of(span: trace.Span) -> str | None:
    """The W3C traceparent of `span` (`00-<trace id>-<span id>-<flags>`); None for a span that is not recording."""
    c = span.get_span_context()
    if not c.is_valid:
        return None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def _link(parent: str | None, attributes: Attributes | None = None) -> Link | None:
    """A link to the span a traceparent names; None when there is none or it does not parse."""
    if not parent:
        return None
    c = trace.get_current_span(W3C.extract({"traceparent": parent})).get_span_context()
    return Link(c, attributes) if c.is_valid else None


class ReceiptSpans:
    """The spans of one process (a proxy, a CLI run), on its own TracerProvider (otel_setup.provider)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("receipt-proxy")
        self._open: dict[str, trace.Span] = {}  # flow id → its span, until `end`

    # --- a matched request's span ------------------------------------------------------------

    def begin(self, flow_id: str, name: str, headers: Mapping[str, str], attributes: Attributes) -> object:
        """
        Start the span of a matched request, as the child of the agent's span when its headers carry
        a traceparent (and tracestate), and make it current; the token to `detach` at the end of the hook.
        """
        parent = W3C.extract({k: v for k in ("traceparent", "tracestate") if (v := headers.get(k)) is not None})
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        if flow_id in self._open:  # a flow's request hook runs once; should it not, the earlier span ends here
            self._open.pop(flow_id).end()
        while len(self._open) >= MAX_OPEN:  # a flow no hook ended (never expected): bounded all the same
            oldest = self._open.pop(next(iter(self._open)))
            oldest.set_status(Status(StatusCode.ERROR, "abandoned: too many spans open"))
            oldest.end()
        self._open[flow_id] = span
        return otel_context.attach(trace.set_span_in_context(span))

    def detach(self, token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]  # the token `begin` returned

    def is_open(self, flow_id: str) -> bool:
        return flow_id in self._open

    def traceparent(self, flow_id: str) -> str | None:
        """The traceparent of a flow's span (recorded on its new receipt: Attempt.trace_parent)."""
        span = self._open.get(flow_id)
        return traceparent_of(span) if span is not None else None

    def inject(self, flow_id: str, headers: MutableMapping[str, str]) -> None:
        """Write the flow's span context into the headers of the request forwarded upstream."""
        span = self._open.get(flow_id)
        if span is not None:
            W3C.inject(headers, context=trace.set_span_in_context(span))

    def annotate(self, flow_id: str, attributes: Attributes, *, link: str | None = None) -> None:
        """Attributes learnt as the request goes on (its receipt), and a link to the span of the receipt it matched."""
        span = self._open.get(flow_id)
        if span is None:
            return
        span.set_attributes(attributes)
        if (to := _link(link, {"receipt.link": "matched"})) is not None:
            span.add_link(to.context, to.attributes)

    def end(self, flow_id: str, attributes: Attributes, *, error: str | None = None) -> None:
        """End a flow's span with its last attributes; `error`: its status says what failed."""
        span = self._open.pop(flow_id, None)
        if span is None:
            return
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # --- spans under the current one, and linked spans ---------------------------------------

    @contextlib.contextmanager
    def child(self, name: str, attributes: Attributes, *, link: str | None = None) -> Iterator[trace.Span]:
        """
        A span under the current one: in a request's hooks and the tasks they start, the request's
        (an approval wait, a reconcile read); elsewhere a root (the CLI's reconcile, a lease expiry).
        `link`: the traceparent of the span that made the receipt (Receipt.trace_parent), linked to.
        """
        links = [to] if (to := _link(link, {"receipt.link": "receipt"})) is not None else None
        with self.tracer.start_as_current_span(
            name,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def lease_expired(self, operation_id: str, attributes: Attributes, *, link: str | None) -> None:
        """
        A receipt taken over from a proxy whose lease expired (gate/leases.py, on the heartbeat's
        thread): a root span of its own, `receipt.lease_expired`, linked to the write's (`link`).
        """
        with self.child("receipt.lease_expired", {"receipt.id": operation_id, **(attributes or {})}, link=link):
            pass

    @staticmethod
    def event(span: trace.Span, name: str, attributes: Attributes) -> None:
        span.add_event(name, attributes)

    @staticmethod
    def failed(span: trace.Span, why: str) -> None:
        span.set_status(Status(StatusCode.ERROR, why))

    # --- logs and shutdown ----------------------------------------------------------------------

    @staticmethod
    def trace_id() -> str | None:
        """The trace id of the current span, for a log line (mitm/json_logs.py); None outside any span."""
        c = trace.get_current_span().get_span_context()
        return f"{c.trace_id:032x}" if c.is_valid else None

    def close(self, timeout: float = 5.0) -> None:
        """End the spans still open (stopping), and export what is batched, within `timeout` seconds."""
        for span in self._open.values():
            span.set_status(Status(StatusCode.ERROR, "the proxy stopped before this request ended"))
            span.end()
        self._open.clear()
        started = time.monotonic()
        self.provider.force_flush(int(timeout * 1000))
        if time.monotonic() - started < timeout:
            self.provider.shutdown()

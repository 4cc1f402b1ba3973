"""gate/receipt_spans.py on the SDK's in-memory exporter: parents, injection, children, links, the bound."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy_addon.gate import receipt_spans
from proxy_addon.gate.receipt_spans import ReceiptSpans

AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
AGENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    made = ReceiptSpans(provider)
    made.exported = exporter  # type: ignore[attr-defined]
    yield made
    provider.shutdown()


def finished(spans) -> list:
    return list(spans.exported.get_finished_spans())


def test_the_agents_traceparent_is_the_parent_and_the_upstream_gets_ours(spans):
    headers = {"traceparent": f"00-{AGENT_TRACE}-{AGENT_SPAN}-01", "tracestate": "a=1"}
    token = spans.begin("f1", "POST x.create", headers, {"receipt.api": "x"})
    forwarded: dict[str, str] = {}
    spans.inject("f1", forwarded)
    mine = spans.traceparent("f1")
    spans.detach(token)
    spans.end("f1", {"receipt.state": "succeeded"})
    (s,) = finished(spans)
    assert (f"{s.context.trace_id:032x}", f"{s.parent.span_id:016x}") == (AGENT_TRACE, AGENT_SPAN)
    assert s.kind is SpanKind.SERVER and s.attributes["receipt.state"] == "succeeded"
    assert forwarded["traceparent"] == mine and mine.startswith(f"00-{AGENT_TRACE}-{s.context.span_id:016x}-")
    assert forwarded["tracestate"] == "a=1"


@pytest.mark.parametrize("bad", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_a_bad_traceparent_starts_a_trace_of_its_own(spans, bad):
    spans.detach(spans.begin("f1", "w", {"traceparent": bad}, {}))
    spans.end("f1", {})
    (s,) = finished(spans)
    assert s.parent is None and s.context.is_valid


def test_a_child_is_under_the_current_request_and_links_to_the_receipts_span(spans):
    spans.detach(spans.begin("orig", "write", {}, {}))
    earlier = spans.traceparent("orig")
    spans.end("orig", {})
    token = spans.begin("dup", "retry", {}, {})
    with spans.child("receipt.reconcile", {"receipt.id": "r1"}, link=earlier):
        pass
    spans.detach(token)
    spans.end("dup", {}, error="outcome_unknown")
    orig, child, dup = finished(spans)
    assert child.parent.span_id == dup.context.span_id and child.kind is SpanKind.INTERNAL
    assert [lk.context.span_id for lk in child.links] == [orig.context.span_id]
    assert dup.status.status_code is StatusCode.ERROR and dup.status.description == "outcome_unknown"


async def test_a_task_started_in_the_request_carries_its_span(spans):
    token = spans.begin("f1", "write", {}, {})

    async def read():
        with spans.child("receipt.reconcile", {}):
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(read())  # as Gate.reconcile starts its read
    spans.detach(token)
    await task
    spans.end("f1", {})
    child, request = finished(spans)
    assert child.parent.span_id == request.context.span_id


def test_outside_any_request_a_change_is_a_linked_root(spans):
    spans.detach(spans.begin("orig", "write", {}, {}))
    earlier = spans.traceparent("orig")
    spans.end("orig", {})
    with spans.child("receipt.reconcile", {}, link=earlier):
        assert spans.trace_id() is not None
    assert spans.trace_id() is None
    orig, cli = finished(spans)
    assert cli.parent is None and cli.context.trace_id != orig.context.trace_id
    assert [lk.context.span_id for lk in cli.links] == [orig.context.span_id]


def test_an_exception_in_a_child_leaves_no_message_in_it(spans):  # a transport error's text may hold a URL
    with pytest.raises(RuntimeError), spans.child("receipt.reconcile", {}):
        raise RuntimeError("https://api.example/?token=SECRET")
    (s,) = finished(spans)
    assert not s.events and "SECRET" not in (s.status.description or "")


def test_open_spans_are_bounded(spans, monkeypatch):
    monkeypatch.setattr(receipt_spans, "MAX_OPEN", 3)
    for n in range(5):
        spans.detach(spans.begin(f"f{n}", "w", {}, {}))
    assert [s.status.description for s in finished(spans)] == ["abandoned: too many spans open"] * 2
    assert not spans.is_open("f0") and spans.is_open("f4")


def test_close_ends_what_is_open(spans):
    spans.detach(spans.begin("f1", "w", {}, {}))
    spans.close()
    (s,) = finished(spans)
    assert s.status.description == "the proxy stopped before this request ended"

"""
The CLI's OpenTelemetry spans: a change it makes to a receipt (`receipts reconcile`, `receipts resolve`)
is a span of its own, linked to the span of the request that made the receipt (Receipt.trace_parent:
gate/receipt_spans.py says why a link and not an event). On only when the standard variables ask for it
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: gate/otel_setup.py), as for any
program; off, nothing of OpenTelemetry is imported.

    with cli_spans.opened() as spans:                       # None while off
        with cli_spans.change(spans, "receipt.reconcile", before) as span: ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from proxy_addon.cli.values import UsageError
from proxy_addon.gate import otel_setup
from proxy_addon.store import Receipt

if TYPE_CHECKING:
    from proxy_addon.gate.receipt_spans import ReceiptSpans

__all__ = ["change", "opened"]

SERVICE = "receipt-proxy-cli"  # service.name, unless OTEL_SERVICE_NAME names another


@contextlib.contextmanager
def opened() -> Iterator[ReceiptSpans | None]:
    """This run's spans, exported before the command returns; None while OpenTelemetry is off."""
    asked = otel_setup.asked_by("", os.environ)
    if asked is None:
        yield None
        return
    try:
        provider = otel_setup.provider("", service=SERVICE)
    except otel_setup.OtelMissing as e:
        raise UsageError(f"{asked}: {e}") from None
    from proxy_addon.gate.receipt_spans import ReceiptSpans  # imports opentelemetry: only now that it is on

    spans = ReceiptSpans(provider)
    try:
        yield spans
    finally:
        spans.close()


@contextlib.contextmanager
def change(spans: ReceiptSpans | None, name: str, before: Receipt) -> Iterator[Any]:
    """A span for a change to `before`, linked to its request's span; None while off."""
    if spans is None:
        yield None
        return
    attributes = {
        "receipt.id": before.operation_id,
        "receipt.api": before.api,
        "receipt.operation": before.operation,
        "receipt.state.before": str(before.state),
    }
    with spans.child(name, attributes, link=before.trace_parent) as span:
        yield span

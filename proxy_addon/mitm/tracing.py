"""
receipts_otel applied: OpenTelemetry turned on (a FlowSpans on a provider of this proxy's own), kept,
or off (None), as the option and the OTEL_EXPORTER_OTLP_* variables say (gate/otel_setup.py).

    addon.traces = tracing.configure(addon.traces, ctx.options.receipts_otel)

Asked for without the `otel` extra installed, the proxy does not start: OptionsError naming the
extra. Off, gate/receipt_spans.py (the one module that imports opentelemetry) is never imported.
"""

from __future__ import annotations

import logging
import os

from mitmproxy import exceptions

from proxy_addon.gate import otel_setup
from proxy_addon.mitm.flow_spans import FlowSpans

__all__ = ["configure"]

logger = logging.getLogger(__name__)
SERVICE = "receipt-proxy"  # service.name, unless OTEL_SERVICE_NAME names another


def configure(current: FlowSpans | None, endpoint: str) -> FlowSpans | None:
    """The spans `endpoint` (receipts_otel) and the environment ask for: `current` when nothing changed."""
    asked = otel_setup.asked_by(endpoint, os.environ)
    if current is not None and (asked is None or current.endpoint != endpoint):
        current.close()  # off now, or another endpoint: what it batched is exported first
        current = None
    if asked is None or current is not None:
        return current
    try:
        provider = otel_setup.provider(endpoint, service=SERVICE)
    except otel_setup.OtelMissing as e:
        raise exceptions.OptionsError(f"{asked}: {e}") from None
    from proxy_addon.gate.receipt_spans import ReceiptSpans  # imports opentelemetry: only now that it is on

    made = FlowSpans(ReceiptSpans(provider), endpoint=endpoint)
    logger.info(f"receipt-proxy: OpenTelemetry on ({asked}): a span per matched write, exported over OTLP/HTTP")
    return made

"""
Whether OpenTelemetry is on, and the tracer provider that exports its spans over OTLP/HTTP.

    asked = otel_setup.asked_by(ctx.options.receipts_otel, os.environ)   # None: off
    provider = otel_setup.provider(endpoint, service="receipt-proxy")    # OtelMissing without the extra

It is off unless `receipts_otel` names an endpoint (the proxy) or one of the standard variables
OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the proxy and the CLI), and
OTEL_SDK_DISABLED is not true. Off, nothing of OpenTelemetry is imported: this module imports it only
inside `provider`. Asked for without the `otel` extra installed: OtelMissing, which names the extra.

The provider is this process's own, never the global one: a library that uses OpenTelemetry's
global API in the same process is not sent our spans, nor we its. The exporter reads the other
standard variables itself (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE ...),
and the provider OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER. Headers may hold
a backend's API key: nothing here logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from proxy_addon.errors import ReceiptsError

__all__ = ["ENDPOINT_VARIABLES", "EXTRA", "OtelMissing", "asked_by", "check_endpoint", "provider", "traces_url"]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
EXTRA = "pip install 'receipt-proxy[otel]'"
TRACES_PATH = "/v1/traces"


class OtelMissing(ReceiptsError):
    """OpenTelemetry was asked for, and the `otel` extra (opentelemetry-sdk, the OTLP/HTTP exporter) is missing."""


def asked_by(endpoint: str, environ: Mapping[str, str]) -> str | None:
    """
    What turns OpenTelemetry on, said for a log line or an error (`receipts_otel`,
    `$OTEL_EXPORTER_OTLP_ENDPOINT`: never the URL, which may carry a password); None: it is off.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if endpoint.strip():
        return "receipts_otel"
    for name in ENDPOINT_VARIABLES:
        if environ.get(name, "").strip():
            return f"${name}"
    return None


def traces_url(endpoint: str) -> str:
    """receipts_otel as the exporter takes it: a base URL gets /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does."""
    endpoint = endpoint.strip()
    if endpoint.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def check_endpoint(endpoint: str) -> None:
    """ValueError unless `endpoint` is empty or an http(s) URL (receipts_otel)."""
    endpoint = endpoint.strip()
    if endpoint and not endpoint.lower().startswith(("http://", "https://")):
        raise ValueError(f"{endpoint!r} is not an http:// or https:// URL of an OTLP/HTTP endpoint (or empty: off)")


def provider(endpoint: str, *, service: str) -> Any:
    """
    A TracerProvider that batches spans to the OTLP/HTTP exporter: to `endpoint` (receipts_otel) if
    given, else where the OTEL_EXPORTER_OTLP_* variables say. OtelMissing without the extra.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise OtelMissing(
            f"OpenTelemetry is asked for, but the otel extra is not installed ({e}): {EXTRA}, "
            "or unset receipts_otel and the OTEL_EXPORTER_OTLP_* variables"
        ) from None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    made = TracerProvider(resource=Resource.create(attributes))
    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint)) if endpoint.strip() else OTLPSpanExporter()
    made.add_span_processor(BatchSpanProcessor(exporter))
    return made

"""gate/otel_setup.py: what turns OpenTelemetry on, the endpoint's URL, and the error without the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy_addon.gate import otel_setup


@pytest.mark.parametrize(
    "endpoint, environ, asked",
    [
        ("", {}, None),
        ("http://collector:4318", {}, "receipts_otel"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "$OTEL_EXPORTER_OTLP_ENDPOINT"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ("", {"OTEL_EXPORTER_OTLP_HEADERS": "x=1"}, None),  # no endpoint: off
        ("http://c:4318", {"OTEL_SDK_DISABLED": "true"}, None),
        ("  ", {"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, None),
    ],
)
def test_what_turns_it_on(endpoint, environ, asked):
    assert otel_setup.asked_by(endpoint, environ) == asked


def test_what_it_says_never_holds_the_url():  # a URL may carry a password
    assert "secret" not in (otel_setup.asked_by("https://u:secret@c:4318", {}) or "")


@pytest.mark.parametrize(
    "endpoint, url",
    [
        ("http://c:4318", "http://c:4318/v1/traces"),
        ("http://c:4318/", "http://c:4318/v1/traces"),
        ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ("https://c/otlp", "https://c/otlp/v1/traces"),
    ],
)
def test_a_base_url_gets_the_traces_path(endpoint, url):
    assert otel_setup.traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["", "http://c:4318", "HTTPS://c"])
def test_good_endpoints(endpoint):
    otel_setup.check_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", ["c:4318", "grpc://c:4317", "127.0.0.1:4318"])
def test_an_endpoint_that_is_no_http_url_is_refused(endpoint):
    with pytest.raises(ValueError, match="not an http:// or https:// URL"):
        otel_setup.check_endpoint(endpoint)


def test_without_the_extra_the_error_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(otel_setup.OtelMissing, match=r"pip install 'receipt-proxy\[otel\]'"):
        otel_setup.provider("http://127.0.0.1:4318", service="receipt-proxy")


def test_off_the_proxy_and_the_cli_import_nothing_of_opentelemetry():
    code = (
        "import sys, proxy_addon.mitm, proxy_addon.cli, proxy_addon.gate.otel_setup; "
        "bad = [m for m in sys.modules if m.startswith('opentelemetry')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

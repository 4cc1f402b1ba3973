"""
A small OTLP/HTTP receiver on 127.0.0.1: what a proxy (or the CLI) exports, decoded with the
opentelemetry-proto package the exporter itself depends on.

    with OtlpReceiver(tmp_path) as otlp:                 # --set receipts_otel={otlp.url}
        ...
        spans = otlp.wait_for(lambda s: [x for x in s if x.name == "..."], what="...")

Every export's body is also kept as it came, in `<directory>/otlp-<n>.otlp` (the marker secrets sweep,
tests/conftest.py, reads every *.otlp file under the run's base directory: a secret in a span's
string is there byte for byte). A `Span` here is a plain record: ids as hex, attributes as Python values.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.conftest import wait_for


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (trace id, span id, attributes)
    resource: dict[str, Any] = field(default_factory=dict)


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


class OtlpReceiver:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spans: list[Span] = []
        self.exports = 0
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                receiver.take(body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.exports += 1
            (self.directory / f"otlp-{self.exports}.otlp").write_bytes(body)
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            Span(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                kind=s.kind,
                                attributes=attributes(s.attributes),
                                status_code=s.status.code,
                                status_message=s.status.message,
                                events=[(e.name, attributes(e.attributes)) for e in s.events],
                                links=[
                                    (lk.trace_id.hex(), lk.span_id.hex(), attributes(lk.attributes)) for lk in s.links
                                ],
                                resource=resource,
                            )
                        )

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def wait_for(self, pick: Callable[[list[Span]], list[Span]], *, what: str) -> list[Span]:
        """Poll (with the suite's generous bound) until `pick` of the spans received so far is non-empty."""
        return wait_for(lambda: pick(self.received()), what=what)

"""
HTTP/2 to the upstream: the fault matrix's cells against an upstream that speaks HTTP/2
(tests/upstream_h2.py), through a real mitmdump with the addon, with each real client.

The proxy's `http2` option is on (mitmproxy's default), so the addon's exchange negotiates h2
with the upstream; the upstream records the protocol of every write, and these tests check it
was HTTP/2 (and HTTP/1.1 once `http2` is off). The rows are H2_FAULTS in
tests/e2e/proxy/test_faults.py, which docs/guarantees.md is generated from. Beyond what each cell
checks (tests/e2e/proxy/test_faults.py, `cell`: the client's answer, the receipt's state and events,
the upstream's commits, what an identical retry gets), each checks that the upstream received the
write exactly once per attempt: httpcore sends a request again on a new connection when a GOAWAY
excludes its stream, and the addon must not let it (the guard itself: tests/mitm/test_httpcore_send.py).
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import wait_for
from tests.e2e.processes import CLIENTS, Clients, Proxy, next_hop
from tests.e2e.proxy.test_faults import H2_FAULTS, H2Fault, cell


def receipt_of(proxy: Proxy, bucket: str):
    from proxy_addon.store import open_store

    store = open_store(proxy.db, create=False)
    try:
        return sorted((r for r in store.list(limit=None) if bucket in r.target), key=lambda r: r.submitted_at)
    finally:
        store.close()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", H2_FAULTS, ids=[f.id for f in H2_FAULTS])
def test_h2_fault_matrix(fault: H2Fault, client: str, proxy, clients: Clients, h2_upstream, bucket):
    path = f"/api/{bucket}/plain"
    if fault.reused:  # a write that succeeds first, so that the next one goes on stream 3 of the same connection
        other = f"b{uuid.uuid4().hex[:12]}"  # a bucket of its own: `cell` looks for this test's receipts by bucket
        before = clients.send(client, "POST", f"{h2_upstream.url}/api/{other}/plain", {"title": "before"})
        assert before.status == 201, before

    cell(fault, client, proxy, clients, h2_upstream, None, bucket)

    writes = h2_upstream.writes(path)
    attempts = 2 if fault.retry == "forwarded" else 1
    assert [w["protocol"] for w in writes] == ["HTTP/2"] * attempts, writes  # over HTTP/2, each attempt once
    assert writes[0]["fault"] == fault.upstream
    if fault.reused:
        assert writes[0]["stream"] == 3, writes  # the path where httpcore's pool would send it again
    receipts = receipt_of(proxy, bucket)
    if fault.state == "not_sent":  # the reason is the upstream's proof, per RFC 9113 §8.7
        assert "not processed (RFC 9113" in (receipts[0].error or ""), receipts[0].error
        assert ("REFUSED_STREAM" if fault.upstream == "refused" else "GOAWAY") in receipts[0].error
        assert receipts[1].state == "succeeded"
    if fault.id == "h2-ok":  # recorded from the HTTP/2 answer: its status and body
        (receipt,) = receipts
        assert receipt.http_status == 201
        assert receipt.response is not None and receipt.response.status == 201
        assert receipt.external_id == "1"


@pytest.mark.parametrize("client", ["httpx", "curl"])
def test_with_http2_off_the_exchange_speaks_http11_to_the_same_upstream(
    client, tmp_path, confdir, tls_upstream, h2_upstream, bucket
):
    """The protocol the upstream records is the exchange's choice: with `http2` off, HTTP/1.1 (ALPN http/1.1)."""
    p = Proxy(tmp_path, confdir, upstream_ca=tls_upstream.cert_path, extra=("--set", "http2=false"))
    p.start()
    try:
        path = f"/api/{bucket}/plain"
        first = Clients(p).send(client, "POST", h2_upstream.url + path, {"title": "h1"})
        assert first.status == 201, first
        again = Clients(p).send(client, "POST", h2_upstream.url + path, {"title": "h1"})
        assert (again.status, again.headers.get("x-receipt-replayed"), again.body) == (201, "true", first.body)
        assert h2_upstream.protocols(path) == ["HTTP/1.1"]
        assert h2_upstream.commits(path) == 1
        (receipt,) = wait_for(lambda: [r for r in receipt_of(p, bucket) if r.state != "submitted"], what="outcome")
        assert receipt.state == "succeeded"
    finally:
        p.stop()


def test_an_https_write_over_http2_through_the_upstream_proxy_mode_is_sent_once(tmp_path, confdir, h2_upstream, bucket):
    """
    `upstream:` mode to an https upstream: httpcore opens a tunnel with a CONNECT that carries the
    write's trace hook too. That CONNECT is not the write: the write goes through, once.
    """
    with next_hop(tmp_path / "next-proxy.log", confdir, h2_upstream.cert_path) as next_port:
        proxy = Proxy(
            tmp_path,
            confdir,
            upstream_ca=confdir / "mitmproxy-ca-cert.pem",
            extra=("--mode", f"upstream:http://127.0.0.1:{next_port}"),
        ).start()
        try:
            path = f"/api/{bucket}/plain"
            answer = Clients(proxy).send("httpx", "POST", h2_upstream.url + path, {"title": "via"})
            assert answer.status == 201, answer.body
            assert h2_upstream.commits(path) == 1 and h2_upstream.seen(path) == 1
            (receipt,) = wait_for(
                lambda: [r for r in receipt_of(proxy, bucket) if r.state != "submitted"], what="outcome"
            )
            assert receipt.state == "succeeded"
        finally:
            proxy.stop()

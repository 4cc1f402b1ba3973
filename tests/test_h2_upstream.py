"""
HTTP/2 to the upstream: the fault matrix's cells against an upstream that speaks HTTP/2
(tests/upstream_h2.py), through a real mitmdump with the addon, with each real client.

The proxy's `http2` option is on (mitmproxy's default), so the addon's exchange negotiates h2
with the upstream; the upstream records the protocol of every write, and these tests check it
was HTTP/2 (and HTTP/1.1 once `http2` is off). The rows are H2_FAULTS in tests/test_faults.py,
which docs/guarantees.md is generated from. Beyond what each cell checks (tests/test_faults.py,
`cell`: the client's answer, the receipt's state and events, the upstream's commits, what an
identical retry gets), each checks that the upstream received the write exactly once per
attempt: httpcore sends a request again on a new connection when a GOAWAY excludes its stream,
and the addon must not let it.
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import CLIENTS, Clients, Proxy, next_hop, wait_for
from tests.test_faults import H2_FAULTS, H2Fault, cell
from tests.upstream_h2 import H2Upstream


@pytest.fixture
def h2_upstream(tls_upstream):
    """An HTTP/2 upstream of this test's own (a new port: the proxy's exchange opens a new connection to it),
    with the certificate of `tls_upstream`, which the test proxies trust."""
    with H2Upstream(certdir=tls_upstream.certdir) as up:
        yield up


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
def test_with_http2_off_the_exchange_speaks_http11_to_the_same_upstream(client, tmp_path, confdir, tls_upstream,
                                                                          h2_upstream, bucket):
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
        proxy = Proxy(tmp_path, confdir, upstream_ca=confdir / "mitmproxy-ca-cert.pem",
                      extra=("--mode", f"upstream:http://127.0.0.1:{next_port}")).start()
        try:
            path = f"/api/{bucket}/plain"
            answer = Clients(proxy).send("httpx", "POST", h2_upstream.url + path, {"title": "via"})
            assert answer.status == 201, answer.body
            assert h2_upstream.commits(path) == 1 and h2_upstream.seen(path) == 1
            (receipt,) = wait_for(lambda: [r for r in receipt_of(proxy, bucket) if r.state != "submitted"],
                                  what="outcome")
            assert receipt.state == "succeeded"
        finally:
            proxy.stop()


def test_a_second_send_of_one_request_is_stopped_before_it_is_written():
    """
    The exchange's trace hook: a CONNECT (an upstream proxy's tunnel) is not the write; the write
    starting a second time (httpcore's pool sends a request again after a GOAWAY, or any other
    way) raises SentTwice, which classifies as outcome_unknown (the first attempt may have been
    processed), never not_sent. Unreachable through a real upstream once the GOAWAY is turned
    into NotProcessed: this holds the guard to its word.
    """
    import asyncio

    import httpcore

    from proxy_addon.mitm.httpcore_send import _Trace
    from proxy_addon.outcome.classify import failure_outcome
    from proxy_addon.outcome.exchange_failures import SentTwice

    trace = _Trace()
    write = httpcore.Request("POST", "https://127.0.0.1/api/x")
    connect = httpcore.Request("CONNECT", "http://127.0.0.1:1")

    async def run():
        await trace("http11.send_request_headers.started", {"request": connect})
        await trace("http2.send_request_headers.started", {"request": write, "stream_id": 1})
        with pytest.raises(SentTwice) as raised:
            await trace("http2.send_request_headers.started", {"request": write, "stream_id": 1})
        return raised.value

    error = asyncio.run(run())
    assert trace.stream_id == 1
    assert failure_outcome(error).state == "outcome_unknown"


def test_a_guard_that_refuses_stops_an_http2_request_before_its_headers(h2_upstream):
    """Over HTTP/2 (httpcore's pool) the guard is asked in the trace hook, before the HEADERS frame: not_sent,
    and the upstream saw no request; a guard that allows lets it go."""
    import asyncio

    from proxy_addon.mitm.exchange import Reply, make_client, send
    from proxy_addon.outcome.classify import Outcome
    from proxy_addon.states import State
    from proxy_addon.wire.upstream import Upstream

    path = f"/api/x{uuid.uuid4().hex[:12]}/plain"
    asked: list = []

    def refuse() -> str:
        asked.append(1)
        return "its time in flight has passed"

    async def run():
        from mitmproxy import http

        async with make_client(Upstream(ca_file=str(h2_upstream.cert_path), http2=True)) as client:
            def req():
                return http.Request.make("POST", f"{h2_upstream.url}{path}", b'{"title": "x"}',
                                         {"Content-Type": "application/json"})

            refused = await send(client, req(), deadline=5, cap=1 << 20, guard=refuse)
            allowed = await send(client, req(), deadline=5, cap=1 << 20, guard=lambda: None)
            return refused, allowed

    refused, allowed = asyncio.run(run())
    assert isinstance(refused, Outcome) and refused.state is State.NOT_SENT, refused
    assert refused.reason == "not sent: its time in flight has passed"
    assert asked == [1]
    assert isinstance(allowed, Reply) and allowed.response.status_code == 201
    assert [w["protocol"] for w in h2_upstream.writes(path)] == ["HTTP/2"]  # the allowed one only

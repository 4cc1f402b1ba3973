"""
A matched request sent through httpcore's pool (proxy_addon/mitm/httpcore_send.py), without a proxy: its
trace hook stops a second send of one request before it is written, and asks the send guard before an
HTTP/2 request's headers (against the HTTP/2 upstream of tests/upstream_h2.py). The fault matrix over
HTTP/2 through a real mitmdump: tests/e2e/proxy/test_h2_upstream.py.
"""

from __future__ import annotations

import uuid

import pytest


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
                headers: dict[str | bytes, str | bytes] = {"Content-Type": "application/json"}
                return http.Request.make("POST", f"{h2_upstream.url}{path}", b'{"title": "x"}', headers)

            refused = await send(client, req(), deadline=5, cap=1 << 20, guard=refuse)
            allowed = await send(client, req(), deadline=5, cap=1 << 20, guard=lambda: None)
            return refused, allowed

    refused, allowed = asyncio.run(run())
    assert isinstance(refused, Outcome) and refused.state is State.NOT_SENT, refused
    assert refused.reason == "not sent: its time in flight has passed"
    assert asked == [1]
    assert isinstance(allowed, Reply) and allowed.response.status_code == 201
    assert [w["protocol"] for w in h2_upstream.writes(path)] == ["HTTP/2"]  # the allowed one only

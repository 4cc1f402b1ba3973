"""
The upstream exchange for matched requests, performed by the addon itself.

Why: when an agent (or its SDK) gives up waiting and disconnects, mitmproxy closes the
upstream side of the exchange, and the receipt can only say `outcome_unknown`, even though
the upstream would have answered a second later. A `request` hook, though, is not cancelled
when the client leaves (checked with mitmproxy 12.3). So the addon sends a matched request
itself, inside its async `request` hook, waits for the real answer up to
`receipts_upstream_timeout`, records it, and sets `flow.response`. The SDK's retry then gets
the recorded answer instead of a second write.

What it keeps from mitmproxy (`Upstream`, built from its options): upstream TLS
verification (`ssl_insecure`, `ssl_verify_upstream_trusted_ca`,
`ssl_verify_upstream_trusted_confdir`), the `upstream:` proxy mode with `upstream_auth`, and
HTTP/2 to the upstream (when `http2` is on). What it refuses: `client_certs` (set
`receipts_forward=mitmproxy` to use them). What changes: a matched request's response is
buffered, not streamed. What a failure means is decided in classify.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import httpx
from mitmproxy import http

from proxy_addon.canonical import ip_literal
from proxy_addon.classify import Outcome, deadline_outcome, failure_outcome
from proxy_addon.upstream import Upstream

# Hop-by-hop headers (RFC 9110 §7.6.1) and framing that the new exchange sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


def make_client(upstream: Upstream) -> httpx.AsyncClient:
    client = upstream.client(
        follow_redirects=False,
        timeout=None,  # send() applies the deadline
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )
    # httpx's own defaults (Accept, Accept-Encoding, User-Agent, Connection) would be added to
    # every request: the upstream gets the agent's headers, and nothing the agent did not send.
    for name in list(client.headers):
        del client.headers[name]
    return client


def end_to_end(fields: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The header fields a proxy passes on: not the hop-by-hop ones, nor those `Connection` names."""
    fields = list(fields)
    named = {
        token.strip().lower()
        for k, v in fields
        if k.lower() == b"connection"
        for token in v.decode("latin-1").split(",")
    }
    return [(k, v) for k, v in fields if (name := k.decode("latin-1").lower()) not in HOP_BY_HOP and name not in named]


async def send(
    client: httpx.AsyncClient, request: http.Request, *, deadline: float, connect_timeout: float = 10.0
) -> http.Response | Outcome:
    """Send `request` once (never retried) and return the upstream's response, or the outcome of its failure."""
    headers = end_to_end(request.headers.fields)
    outgoing = client.build_request(
        request.method,
        # An IP host in another spelling (`0177.0.0.1`, which httpx refuses) is connected to as the
        # address it names; the Host header stays the agent's. httpx brackets an IPv6 host itself.
        httpx.URL(scheme=request.scheme, host=ip_literal(request.host) or request.host, port=request.port),
        headers=headers,
        content=request.raw_content or b"",
        timeout=httpx.Timeout(deadline, connect=min(connect_timeout, deadline)),
        # The request target exactly as the agent sent it (httpx would remove `.` segments).
        extensions={"target": request.data.path},
    )
    try:
        async with asyncio.timeout(deadline):
            upstream = await client.send(outgoing, stream=True)
            try:
                raw = b"".join([chunk async for chunk in upstream.aiter_raw()])
            finally:
                await upstream.aclose()
    except TimeoutError:
        return deadline_outcome(deadline)
    except httpx.HTTPError as e:
        return failure_outcome(e)
    fields = end_to_end(upstream.headers.raw)
    response = http.Response(
        http_version=b"HTTP/2.0" if upstream.http_version == "HTTP/2" else upstream.http_version.encode(),
        status_code=upstream.status_code,
        reason=upstream.reason_phrase.encode(),
        headers=http.Headers(fields),
        content=raw,
        trailers=None,
        timestamp_start=time.time(),
        timestamp_end=time.time(),
    )
    response.headers["content-length"] = str(len(raw))
    return response

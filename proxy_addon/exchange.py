"""
The upstream exchange for matched requests, performed by the addon itself.

Why: when an agent (or its SDK) gives up waiting and disconnects, mitmproxy closes the
upstream side of the exchange, and the receipt can only say `outcome_unknown`, even though
the upstream would have answered a second later. A `request` hook, though, is not cancelled
when the client leaves (checked with mitmproxy 12.3). So the addon sends a matched request
itself, inside its async `request` hook, waits for the real answer up to
`receipts_upstream_timeout`, records it, and sets `flow.response`. The SDK's retry then gets
the recorded answer instead of a second write.

What it keeps from mitmproxy: upstream TLS verification (`ssl_insecure`,
`ssl_verify_upstream_trusted_ca`, `ssl_verify_upstream_trusted_confdir`), the `upstream:`
proxy mode with `upstream_auth`, and HTTP/2 to the upstream (when `http2` is on). What it
refuses: `client_certs` (set `receipts_forward=mitmproxy` to use them). What changes: a
matched request's response is buffered, not streamed.

Classification of transport failures (httpx's exception types):
- the connection was never established (ConnectError, which includes TLS handshake
  failures; ConnectTimeout; PoolTimeout) → not_sent;
- anything after the request could have been written (WriteError, ReadError, ReadTimeout,
  RemoteProtocolError, our overall deadline) → outcome_unknown.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import Any

import certifi
import httpx
from mitmproxy import http

from proxy_addon.classify import maybe_sent, never_sent
from proxy_addon.states import State

# Hop-by-hop headers (RFC 9110 §7.6.1) and framing that the new exchange sets itself.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
    "te", "trailer", "transfer-encoding", "upgrade", "content-length",
})
NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True)
class Failure:
    state: State
    message: str
    timed_out: bool = False  # our own deadline passed


# mitmproxy options the client is built from (absent ones, as under taddons, count as unset).
CLIENT_OPTIONS = ("ssl_insecure", "ssl_verify_upstream_trusted_ca", "ssl_verify_upstream_trusted_confdir",
                  "mode", "upstream_auth", "http2")


def ssl_context(options: Any) -> ssl.SSLContext | bool:
    """Upstream TLS verification as mitmproxy's own options configure it."""
    if getattr(options, "ssl_insecure", False):
        return False
    ca = getattr(options, "ssl_verify_upstream_trusted_ca", None)
    capath = getattr(options, "ssl_verify_upstream_trusted_confdir", None)
    return ssl.create_default_context(cafile=ca or (None if capath else certifi.where()), capath=capath or None)


def upstream_proxy(options: Any) -> httpx.Proxy | None:
    """The `upstream:URL` proxy mode, with `upstream_auth`, if mitmproxy runs in it."""
    for mode in getattr(options, "mode", ()):
        if mode.startswith("upstream:"):
            url = mode.split(":", 1)[1].split("@")[0]
            auth_spec = getattr(options, "upstream_auth", None)
            auth = tuple(auth_spec.split(":", 1)) if auth_spec else None
            return httpx.Proxy(url, auth=auth)  # type: ignore[arg-type]
    return None


def unsupported(options: Any) -> str | None:
    """Why the addon cannot send matched requests itself with these options, or None."""
    if getattr(options, "client_certs", None):
        return "client_certs is set; use --set receipts_forward=mitmproxy to send matched requests with client certificates"
    return None


def make_client(options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=ssl_context(options),
        proxy=upstream_proxy(options),
        http2=bool(getattr(options, "http2", False)),
        trust_env=False,
        follow_redirects=False,
        timeout=None,  # send() applies the deadline
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


def classify_failure(e: BaseException) -> Failure:
    detail = str(e) or type(e).__name__
    if isinstance(e, NOT_SENT_ERRORS):
        return Failure(State.NOT_SENT, never_sent(detail))
    return Failure(State.OUTCOME_UNKNOWN, maybe_sent(f"{type(e).__name__}: {detail}"))


async def send(client: httpx.AsyncClient, request: http.Request, *, deadline: float,
               connect_timeout: float = 10.0) -> http.Response | Failure:
    """Send `request` once (never retried) and return the upstream's response, or why there is none."""
    headers = [(k, v) for k, v in request.headers.fields if k.decode("latin-1").lower() not in HOP_BY_HOP]
    outgoing = client.build_request(
        request.method, request.url, headers=headers, content=request.raw_content or b"",
        timeout=httpx.Timeout(deadline, connect=min(connect_timeout, deadline)),
    )
    try:
        async with asyncio.timeout(deadline):
            upstream = await client.send(outgoing, stream=True)
            try:
                raw = b"".join([chunk async for chunk in upstream.aiter_raw()])
            finally:
                await upstream.aclose()
    except TimeoutError:
        return Failure(State.OUTCOME_UNKNOWN, f"outcome unknown: no answer within receipts_upstream_timeout ({deadline:g}s)",
                       timed_out=True)
    except httpx.HTTPError as e:
        return classify_failure(e)
    fields = [(k, v) for k, v in upstream.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP]
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

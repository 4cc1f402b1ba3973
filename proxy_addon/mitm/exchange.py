"""
The upstream exchange for matched requests, performed by the addon itself.

Why: when an agent (or its SDK) gives up waiting and disconnects, mitmproxy closes the
upstream side of the exchange, and the receipt can only say `outcome_unknown`, even though
the upstream would have answered a second later. A `request` hook, though, is not cancelled
when the client leaves (checked with mitmproxy 12.3). So the addon sends a matched request
itself, inside its async `request` hook, waits for the real answer up to
`receipts_upstream_timeout`, records it, and sets `flow.response`. The SDK's retry then gets
the recorded answer instead of a second write.

How it sends (`Client`, chosen per origin):
- HTTP/1.1 upstreams, reached directly: through a keep-alive pool of its own (http1.py, h11
  on asyncio's streams): 0.23 ms of CPU per request against httpcore's 0.53 (measured in one
  process against bench/upstream.py; 0.9 against 1.4 ms, and 1.0 against 1.6 over TLS, against
  tests/upstream.py, whose answers come in two segments).
- With `http2` on, an https connection offers h2 and http/1.1 by ALPN. An upstream that
  chooses h2 (as large public APIs commonly do) is remembered, and its requests go through httpcore's pool
  (`Upstream.pool`), which speaks HTTP/2; the connection that found it out is closed before a
  byte of the request is written: one TLS handshake per origin, once. Why not h11 for them too:
  over TLS, httpcore's HTTP/2 costs about what h11's HTTP/1.1 does (1.0 ms a request against
  the same h2 upstream, tests/upstream_h2.py), and HTTP/2 is what mitmproxy's `http2` asks for.
- Through an `upstream:` proxy (CONNECT for https, absolute-form for http, `upstream_auth`):
  httpcore's pool, always.
Sending through httpcore's pool is httpcore_send.py. Both raise httpx's errors: outcome/classify.py
reads those.

What it keeps from mitmproxy (`Upstream`, built from its options): upstream TLS
verification (`ssl_insecure`, `ssl_verify_upstream_trusted_ca`,
`ssl_verify_upstream_trusted_confdir`), the `upstream:` proxy mode with `upstream_auth`, and
HTTP/2 to the upstream (when `http2` is on). What it refuses: `client_certs` (set
`receipts_forward=mitmproxy` to use them). What a failure means is decided in outcome/classify.py,
from what outcome/exchange_failures.py proves: a request our client refused before writing a byte of
it (not_sent) is told from one cut short after (outcome_unknown), and an HTTP/2 stream the
upstream proved it did not process (REFUSED_STREAM, a GOAWAY that excludes it: not_sent) from
one reset or cut off after (outcome_unknown).

Sent once: neither pool sends a request twice (http1.py never does; httpcore_send.py stops
httpcore's pool from sending it again after a GOAWAY).

Sent only while it may be: "just before the first byte" is where each pool writes the request,
on the connection it goes on, after the connection is open (a new one may take up to
`connect_timeout`): http1.py asks the `guard` right before it hands the request's bytes to the
socket, and httpcore_send.py in httpcore's trace hook right before it writes the headers
(HTTP/1.1 or HTTP/2). Nothing is awaited between the question and the write. A refusal is
`SendStopped`: not_sent (gate/send_guard.py says what it checks and why that is enough).

What changes: a matched request's answer is held, not streamed (but below). mitmproxy 12
sends a response set by the `request` hook in one piece (`send_response()` has no streaming
path for it; `Response.stream` is read only for an answer mitmproxy reads from a server itself).
So memory is bounded per exchange instead (docs/limits.md):
- `send` reads the body up to `cap` (receipts_response_cap). An answer that ends within it
  is classified and recorded whole, as always; a failure before then is a failure outcome
  (half an answer is outcome_unknown, as in the fault matrix).
- Past `cap`, `send` returns the head and first bytes (`Reply.complete` False): the addon
  classifies the outcome from the status and headers and records it at once, before the
  rest is read.
- `Reply.read_rest` then reads the rest into memory while the agent is connected, up to
  `limit` (receipts_response_max) and the exchange's deadline: the whole body is passed on;
  past the limit, after the deadline, or when the body breaks off, the upstream connection
  is closed and the agent gets the proxy's answer saying so; when the agent has gone
  (checked every 0.2 s), the connection is closed at once.
An answer `send` is told to stream (`streamed`, asked with the head: an MCP tool call's event
stream) is returned with its head alone (`Reply.streamed`), its body read by the caller as it
comes (`Reply.chunks`, within `Reply.ends` as long as the caller wants): streaming.py passes it
on through relay.py, which mitmproxy streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import httpx
from mitmproxy import http

from proxy_addon.mitm import httpcore_send
from proxy_addon.mitm.http1 import Answer, Http1Pool, SpeaksHttp2
from proxy_addon.outcome.classify import Outcome, deadline_outcome, failure_outcome
from proxy_addon.outcome.exchange_failures import CLIENT_ERRORS
from proxy_addon.wire.canonical import ip_literal
from proxy_addon.wire.upstream import Upstream

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


def make_client(upstream: Upstream) -> Client:
    """The connections the exchange sends through (`Client`), as `upstream` says to reach upstreams."""
    return Client(upstream)


class Client:
    """
    The exchange's connections (the module docstring says which carries what): `http1`, its own
    HTTP/1.1 pool (none through an upstream proxy), and `pool`, httpcore's, as httpx would build
    it. Neither adds anything to the agent's headers but `Host` (when it sent none) and the
    body's framing, nor sends back a cookie an upstream set.
    """

    def __init__(self, upstream: Upstream) -> None:
        self.pool = upstream.pool(max_keepalive=64)
        self.http1: Http1Pool | None = None
        self._http2 = upstream.http2
        if upstream.proxy is None:
            context = httpx.create_ssl_context(verify=upstream.verify(), trust_env=False)
            context.set_alpn_protocols(["h2", "http/1.1"] if upstream.http2 else ["http/1.1"])
            self.http1 = Http1Pool(context, max_keepalive=64)

    def http1_for(self, scheme: bytes, host: bytes, port: int) -> Http1Pool | None:
        """The HTTP/1.1 pool when it carries requests to this origin, else None (httpcore's pool does)."""
        if self.http1 is None or (self._http2 and scheme == b"https" and self.http1.speaks_http2((scheme, host, port))):
            return None
        return self.http1

    async def aclose(self) -> None:
        if self.http1 is not None:
            await self.http1.aclose()
        await self.pool.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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
    client: Client,
    request: http.Request,
    *,
    deadline: float,
    cap: int,
    connect_timeout: float = 10.0,
    streamed: Callable[[int, list[tuple[bytes, bytes]]], bool] | None = None,
    guard: Callable[[], str | None] | None = None,
) -> Reply | Outcome:
    """
    Send `request` once (never retried) and read the answer's body up to `cap` bytes: the
    `Reply` (complete, or its head and first bytes with the rest still to read), or the outcome
    of a failure before that. `deadline` (seconds) covers it all, the rest of the body too.
    `streamed(status, header fields)` True: the head alone, its body not read (`Reply.streamed`).
    `guard` (gate/send_guard.py) is asked just before the first byte of the request is written, on
    the connection it goes on: a reason it gives makes the outcome not_sent, nothing written.
    """
    try:
        scheme, host, port, netloc = origin(request.scheme, request.host, request.port)
    except httpx.InvalidURL as e:  # refused before anything was sent: not_sent (exchange_failures.local_refusal)
        return failure_outcome(e)
    content = request.raw_content or b""
    headers = framed(end_to_end(request.headers.fields), netloc, request.method, content)
    to = port or (443 if scheme == b"https" else 80)
    http1 = client.http1_for(scheme, host, to)
    loop = asyncio.get_running_loop()
    ends = loop.time() + deadline
    try:
        async with asyncio.timeout(deadline):
            head: Answer | httpcore_send.Answer | None = None
            if http1 is not None:
                with contextlib.suppress(SpeaksHttp2):  # nothing written: over HTTP/2, through httpcore
                    head = await http1.send(
                        scheme,
                        host,
                        to,
                        request.data.method,
                        request.data.path,  # the request target exactly as the agent sent it
                        headers,
                        content,
                        connect_timeout=min(connect_timeout, deadline),
                        guard=guard,
                    )
            if head is None:
                head = await httpcore_send.send(
                    client.pool, request, scheme, host, port, headers, content, deadline, connect_timeout, guard
                )
            chunks, close = head.body(), head.aclose
            stream = streamed is not None and streamed(head.status, head.headers)
            body, complete = await _first_bytes(chunks, close, cap, read=not stream)
    except TimeoutError:
        return deadline_outcome(deadline)
    except CLIENT_ERRORS as e:  # h11's own errors too: classify tells a refused head from a body cut short
        return failure_outcome(e)
    response = _response(head, body, stream)
    return Reply(response, complete, None if complete else _Rest(chunks, close, ends), streamed=stream)


async def _first_bytes(
    chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]], cap: int, *, read: bool
) -> tuple[io.BytesIO, bool]:
    """
    The answer's body read up to `cap` bytes (`read` False: none of it, a stream passed on), and
    whether that is all of it; the connection closed once it is (or on an error), else left open
    for the rest.
    """
    body = io.BytesIO()
    complete = read
    try:
        while complete and (chunk := await anext(chunks, None)) is not None:
            body.write(chunk)
            complete = body.tell() <= cap
    except BaseException:
        await close()
        raise
    if complete:
        await close()
    return body, complete


def _response(head: Answer | httpcore_send.Answer, body: io.BytesIO, stream: bool) -> http.Response:
    """mitmproxy's response for an answer's head and the body read (framed by its length unless streamed)."""
    status, phrase, version = head.status, head.reason, head.http_version
    response = http.Response(
        http_version=b"HTTP/2.0" if version == b"HTTP/2" else version,
        status_code=status,
        reason=phrase.decode("ascii", "ignore").encode() if phrase else httpx.codes.get_reason_phrase(status).encode(),
        headers=http.Headers(end_to_end(head.headers)),
        content=body.getvalue(),  # hands the buffer over, no copy
        trailers=None,
        timestamp_start=time.time(),
        timestamp_end=time.time(),
    )
    if not stream:
        response.headers["content-length"] = str(len(response.raw_content or b""))
    return response


@functools.lru_cache(maxsize=1024)
def origin(scheme: str, host: str, port: int) -> tuple[bytes, bytes, int | None, bytes]:
    """
    Where to connect, as httpx's URL spells it (scheme, IDNA host, port unless the scheme's
    default, and the `Host` value it would send), or httpx.InvalidURL. An IP host in another
    spelling (`0177.0.0.1`, which httpx refuses) is connected to as the address it names; the
    Host header stays the agent's. httpx brackets an IPv6 host itself. Kept per origin (bounded):
    parsing it is a tenth of the exchange's CPU.
    """
    url = httpx.URL(scheme=scheme, host=ip_literal(host) or host, port=port)
    return url.raw_scheme, url.raw_host, url.port, url.netloc


def framed(fields: list[tuple[bytes, bytes]], netloc: bytes, method: str, content: bytes) -> list[tuple[bytes, bytes]]:
    """
    The header fields the request is sent with, as httpx frames them: the agent's `Host`, else
    the URL's; then the agent's end-to-end fields, and the body's `Content-Length` (`0` for an
    empty POST, PUT or PATCH; none for another empty request).
    """
    head = [] if any(k.lower() == b"host" for k, _ in fields) else [(b"Host", netloc)]
    if content:
        fields.append((b"Content-Length", str(len(content)).encode()))
    elif method in ("POST", "PUT", "PATCH"):
        head.append((b"Content-Length", b"0"))
    return head + fields


@dataclass
class Rest:
    """How reading the rest of an answer ended: `body` is the whole body when it was read in full."""

    body: bytes | None
    received: int  # bytes of body read in all
    why: str  # "complete", "too_large", "agent_left", "timeout" or "broken"
    detail: str = ""


@dataclass
class _Rest:
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]  # closes the upstream connection
    ends: float  # the exchange's deadline, on the event loop's clock


@dataclass
class Reply:
    """
    The upstream's answer. `complete`: `response` holds the whole body. Otherwise it holds the
    head and the first bytes (more than the cap given to `send`), and the rest is still to be
    read with `read_rest`, or dropped with `aclose`.
    """

    response: http.Response
    complete: bool
    _rest: _Rest | None = None
    streamed: bool = False  # the head alone: the body is read with `chunks`, as it comes

    @property
    def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body, as it comes (no deadline of its own: see `ends`)."""
        assert self._rest is not None, "the answer was complete"
        return self._rest.chunks

    @property
    def ends(self) -> float:
        """The exchange's deadline, on the event loop's clock."""
        assert self._rest is not None, "the answer was complete"
        return self._rest.ends

    async def read_rest(self, *, limit: int, wanted: Callable[[], bool], poll: float = 0.2) -> Rest:
        """
        Read the rest of the body into memory while `wanted()` (the agent is still there), up to
        `limit` bytes of body in all, and never past the exchange's deadline. The upstream
        connection is closed whatever happens.
        """
        rest = self._rest
        assert rest is not None, "the answer was complete"
        body = io.BytesIO()
        body.write(self.response.raw_content or b"")
        self.response.raw_content = b""  # one copy: the one being filled

        async def pump() -> str:
            async for chunk in rest.chunks:
                if body.tell() + len(chunk) > limit:
                    return "too_large"
                body.write(chunk)
            return "complete"

        loop = asyncio.get_running_loop()
        task = loop.create_task(pump())
        why, detail = "", ""
        try:
            while not why:
                remaining = rest.ends - loop.time()
                if not wanted():
                    why = "agent_left"
                elif remaining <= 0:
                    why = "timeout"
                else:
                    await asyncio.wait([task], timeout=min(poll, remaining))
                    if task.done():
                        try:
                            why = task.result()
                        except (httpx.HTTPError, httpx.StreamError) as e:
                            why, detail = "broken", f"{type(e).__name__}: {e}"
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, httpx.StreamError):
                    await task
            await self.aclose()
        received = body.tell()
        return Rest(body.getvalue() if why == "complete" else None, received, why, detail)

    async def aclose(self) -> None:
        """Close the upstream connection (a body not read to its end: the connection is not reused)."""
        if self._rest is not None:
            await self._rest.close()

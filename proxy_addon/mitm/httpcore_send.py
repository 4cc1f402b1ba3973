"""
A matched request sent through httpcore's connection pool (`Upstream.pool`): the exchange's way
(exchange.py) to upstreams that chose HTTP/2 by ALPN, and through an `upstream:` proxy (CONNECT
for https, absolute-form for http, `upstream_auth`). HTTP/1.1 upstreams reached directly go
through http1.py instead.

    answer = await send(pool, request, scheme, host, port, headers, content, deadline, connect_timeout)
    answer.status, answer.reason, answer.http_version, answer.headers   # the head, as http1.Answer's
    async for chunk in answer.body(): ...                                # the body
    await answer.aclose()                                                # the connection released, or closed

httpcore is used directly, not through httpx's client: the same connections, without the
layers the exchange would not use, and no cookie jar. httpcore's errors are raised as httpx's
(`httpx_errors`), as http1.py raises its own: outcome/classify.py reads those.

Sent once: httpcore's connection pool sends a request again, on a new connection, when a
GOAWAY excludes its stream. The request is watched through httpcore's `trace` extension
(`_Trace`): the upstream's proof that it did not process the stream becomes `NotProcessed`
(outcome/exchange_failures.py, `not_processed`) before the pool can act on it, and a second start of
the same request is stopped (`SentTwice`) before a byte of it is written. The same hook asks the
caller's `guard` (gate/send_guard.py) right before the request's headers are written (`SendStopped`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator

import httpcore
import httpx
from mitmproxy import http

from proxy_addon.outcome.exchange_failures import NotProcessed, SendStopped, SentTwice, not_processed


@contextlib.contextmanager
def httpx_errors() -> Iterator[None]:
    """
    httpcore's errors as httpx's (the same name: httpx.ReadError for httpcore.ReadError), raised
    from the original, as httpx's transport maps them: outcome/classify.py reads httpx's types, and the
    chain (`__cause__`, its traceback) still shows where httpcore raised it.
    """
    try:
        yield
    except Exception as e:
        mapped = next((_HTTPX[t] for t in type(e).__mro__ if t in _HTTPX), None)
        if mapped is None:
            raise
        raise mapped(str(e)) from e


_HTTPX: dict[type, type[httpx.HTTPError]] = {
    getattr(httpcore, name): getattr(httpx, name)
    for name in (
        "TimeoutException",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "NetworkError",
        "ConnectError",
        "ReadError",
        "WriteError",
        "ProxyError",
        "UnsupportedProtocol",
        "ProtocolError",
        "LocalProtocolError",
        "RemoteProtocolError",
    )
}


class Answer:
    """httpcore's answer, with its body still to read (`body`): the head as http1.Answer gives it."""

    __slots__ = ("_upstream", "headers", "http_version", "reason", "status")

    def __init__(self, upstream: httpcore.Response) -> None:
        self._upstream = upstream
        self.status: int = upstream.status
        self.headers: list[tuple[bytes, bytes]] = upstream.headers
        self.http_version: bytes = upstream.extensions.get("http_version", b"HTTP/1.1")
        self.reason: bytes = upstream.extensions.get(
            "reason_phrase", b""
        )  # HTTP/2 has none: exchange.py uses the status's

    async def body(self) -> AsyncIterator[bytes]:
        stream: AsyncIterable[bytes] = self._upstream.stream  # type: ignore[assignment]
        with httpx_errors():
            async for chunk in stream:
                yield chunk

    async def aclose(self) -> None:
        with httpx_errors():
            await self._upstream.aclose()


async def send(
    pool: httpcore.AsyncConnectionPool,
    request: http.Request,
    scheme: bytes,
    host: bytes,
    port: int | None,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
    deadline: float,
    connect_timeout: float,
    guard: Callable[[], str | None] | None = None,
) -> Answer:
    """
    The request through httpcore's pool (HTTP/2, an upstream proxy): its answer's head, the body
    still to read. `guard` is asked in the trace hook right before the request's headers are
    written: a reason it gives raises SendStopped, nothing of the request written.
    """
    outgoing = httpcore.Request(
        request.data.method,
        # The request target exactly as the agent sent it (httpx would remove `.` segments).
        httpcore.URL(scheme=scheme, host=host, port=port, target=request.data.path),
        headers=headers,
        content=content,
        extensions={
            "timeout": {
                "connect": min(connect_timeout, deadline),
                "read": deadline,
                "write": deadline,
                "pool": deadline,
            },
            "trace": _Trace(guard),
        },
    )
    with httpx_errors():
        upstream = await pool.handle_async_request(outgoing)
    return Answer(upstream)


# httpcore's trace events (`<http11|http2>.<step>.<started|complete|failed>`) that `_Trace` acts on.
_SENDS = frozenset({"http11.send_request_headers.started", "http2.send_request_headers.started"})
# The HTTP/2 steps before the answer's head is read: a proof that the stream was not processed counts there.
_BEFORE_HEAD = frozenset(
    {"http2.send_request_headers.failed", "http2.send_request_body.failed", "http2.receive_response_headers.failed"}
)


class _Trace:
    """
    httpcore's `trace` hook for one request: the HTTP/2 stream it goes on; the upstream's proof
    that the stream was not processed, raised as `NotProcessed` where httpcore reports it (its
    pool would otherwise send the request again on a new connection); and a stop to any second
    send of the request, before a byte of it is written. A CONNECT to an upstream proxy, which
    carries the request's extensions, is another request: not counted.
    """

    __slots__ = ("guard", "sends", "stream_id")

    def __init__(self, guard: Callable[[], str | None] | None = None) -> None:
        self.guard = guard
        self.sends = 0
        self.stream_id: int | None = None

    async def __call__(self, name: str, info: dict) -> None:
        if name in _SENDS:
            if info["request"].method == b"CONNECT":
                return
            self.sends += 1
            if self.sends > 1:
                raise SentTwice("httpcore was about to send the request again; stopped before it was written")
            if self.guard is not None and (why := self.guard()) is not None:
                raise SendStopped(why)
            self.stream_id = info.get("stream_id")
        elif name in _BEFORE_HEAD:
            error = info["exception"]
            proof = not_processed(error, self.stream_id)
            if proof is not None:
                raise NotProcessed(proof) from error

"""
HTTP/1.1 to an upstream on asyncio's streams with h11: a keep-alive pool of connections, and
one request sent on one of them, never twice. The exchange (exchange.py) uses it for HTTP/1.1
upstreams; it costs less than half of httpcore's CPU per request (its anyio streams, its pool's
locks and its trace machinery are most of httpcore's cost here).

    pool = Http1Pool(ssl_context, max_keepalive=64, keepalive_expiry=5.0)
    answer = await pool.send(b"https", b"api.example.com", 443, b"POST", b"/v1/x", headers, body,
                             connect_timeout=10)
    answer.status, answer.reason, answer.headers   # the head
    async for chunk in answer.body(): ...           # the body; the connection goes back to the pool
    await answer.aclose()                           # ...or is closed, if the body was not read to its end

What a failure means (outcome/classify.py reads httpx's types; each is raised from the original error):
- Before a byte of the request is written: httpx.ConnectError (refused, unreachable, DNS, the
  TLS handshake failed or the certificate was refused) and httpx.ConnectTimeout → not_sent;
  the caller's `guard`, asked right before the write, stopped it (SendStopped) → not_sent;
  a request head h11 will not build (two Host fields, a header it refuses) → an
  httpx.LocalProtocolError raised from h11's, under `_h11_request_bytes` (outcome/exchange_failures.py's
  `_HEAD_BUILDERS`): nothing was written → not_sent.
- Once the request's bytes were handed to the connection (one write: head and body): any
  failure is httpx.ReadError, httpx.RemoteProtocolError or httpx.WriteError → outcome_unknown,
  whatever the connection (a new one, or one reused).

Keep-alive: a connection goes back to the pool only when both sides finished their message
cleanly (h11's DONE/DONE), up to `max_keepalive` idle connections in all, each for
`keepalive_expiry` seconds. Before a request is written on an idle connection, the connection
is checked: the server closed it, reset it, or sent anything unasked (a 408, a close), or it was
idle too long: it is closed and the request goes on a new connection; not one byte of it was
written on the old one. The check reads the socket itself (`poll`), not only what the event
loop has seen: a FIN the loop has not yet read is caught too. A server that closes a connection
after that check, while the request is on its way, leaves the request outcome_unknown: it is
never sent again, on this connection or another.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import time
from collections.abc import AsyncIterator, Callable

import h11
import httpx

from proxy_addon.outcome.exchange_failures import SendStopped

_READ = 65536
_MAX_HEAD = 100 * 1024  # the largest answer head read, as httpcore's (h11's own default is 16 KiB)
Key = tuple[bytes, bytes, int]  # scheme, host, port
# What opening a connection raises when it fails (ssl.SSLError, a refused certificate among them, is an OSError;
# a host name that cannot be encoded is a ValueError), and what reading a broken one raises.
_CONNECT_ERRORS = (OSError, ValueError)
_READ_ERRORS = (OSError,)


class _Conn:
    __slots__ = ("h11", "idle_since", "key", "reader", "writer")

    def __init__(self, key: Key, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        self.idle_since = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection can carry a request: open, quiet, and not idle too long."""
        if now - self.idle_since > expiry:
            return False
        reader = self.reader
        if self.writer.transport.is_closing() or reader.at_eof() or reader.exception() is not None:
            return False
        # Bytes the server sent unasked (a 408, say), read with the last answer (h11 holds them) or since.
        if self.h11.trailing_data != (b"", False) or len(getattr(reader, "_buffer", b"")):
            return False
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        try:  # what the loop has not read yet: a FIN, a reset, bytes
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def abort(self) -> None:
        self.writer.transport.abort()

    def close(self) -> None:
        self.writer.close()


class Answer:
    """An answer's head, with its body still to read (`body`), on a connection this answer holds until then."""

    __slots__ = ("_conn", "_pool", "headers", "http_version", "reason", "status")

    def __init__(self, pool: Http1Pool, conn: _Conn, head: h11.Response) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status: int = head.status_code
        self.reason: bytes = head.reason
        self.http_version: bytes = b"HTTP/" + head.http_version
        self.headers: list[tuple[bytes, bytes]] = head.headers.raw_items()

    async def body(self) -> AsyncIterator[bytes]:
        """The body's chunks. Read to its end, the connection goes back to the pool (when it can be reused)."""
        conn = self._conn
        assert conn is not None, "the answer was closed"
        try:
            while True:
                event = await _next_event(conn)
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) is h11.EndOfMessage:
                    break
                else:
                    raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__} in the answer's body")
        except BaseException:
            self._conn = None
            conn.abort()
            raise
        self._conn = None
        self._pool._release(conn)

    async def aclose(self) -> None:
        """Close the connection if the body was not read to its end (it cannot carry another request)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
            with contextlib.suppress(Exception):  # the socket is closed once the loop has run the transport's close
                await conn.writer.wait_closed()


class SpeaksHttp2(Exception):
    """The upstream chose HTTP/2 by ALPN on a new connection: closed before a byte of the request was written."""


class Http1Pool:
    """
    Keep-alive HTTP/1.1 connections to upstreams, by (scheme, host, port); no limit on the
    connections open at once, `max_keepalive` idle ones in all. `ssl_context` verifies https
    upstreams; its ALPN protocols are the ones offered. When it offers h2 too and an upstream
    chooses it, the new connection is closed before the request is written, the origin is
    remembered (`speaks_http2`, up to `MAX_HTTP2_ORIGINS`, the oldest forgotten first), and
    `send` raises SpeaksHttp2: the caller sends it over HTTP/2 itself.
    """

    MAX_HTTP2_ORIGINS = 1024

    def __init__(self, ssl_context: ssl.SSLContext, *, max_keepalive: int = 64, keepalive_expiry: float = 5.0) -> None:
        self._ssl = ssl_context
        self._max = max_keepalive
        self._expiry = keepalive_expiry
        self._idle: dict[Key, list[_Conn]] = {}
        self._count = 0
        self._closed = False
        self._http2: dict[Key, None] = {}  # origins that chose h2, oldest first

    def speaks_http2(self, key: Key) -> bool:
        """Whether the upstream at `key` (scheme, host, port) chose HTTP/2 on a connection of this pool."""
        return key in self._http2

    async def send(
        self,
        scheme: bytes,
        host: bytes,
        port: int,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        connect_timeout: float,
        guard: Callable[[], str | None] | None = None,
    ) -> Answer:
        """
        Send the request once, and return the answer's head (the module docstring says what a
        failure means), or raise SpeaksHttp2 (nothing written). `guard` is asked last, on the
        open connection, right before the request's bytes are written (nothing awaited in
        between): a reason it gives raises SendStopped, nothing written.
        """
        key = (scheme, host, port)
        conn = self._take(key)
        if conn is None:
            conn = await self._connect(key, connect_timeout)
        try:
            data = _h11_request_bytes(conn.h11, method, target, headers, body)
        except h11.LocalProtocolError as e:  # nothing written: the connection is closed, never reused
            conn.abort()
            raise httpx.LocalProtocolError(str(e)) from e
        try:
            if guard is not None and (why := guard()) is not None:
                raise SendStopped(why)
            try:
                conn.writer.writelines(data)  # from here on, the request may have reached the upstream
            except Exception as e:
                raise httpx.WriteError(str(e) or type(e).__name__) from e
            while True:
                event = await _next_event(conn)
                if type(event) is h11.Response:
                    return Answer(self, conn, event)
                if type(event) is not h11.InformationalResponse:  # a 1xx is skipped, as httpcore does
                    raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__} before the answer's head")
        except BaseException:
            conn.abort()
            raise

    def _take(self, key: Key) -> _Conn | None:
        """The most recently used idle connection to `key` that can carry a request; unusable ones are closed."""
        idle = self._idle.get(key)
        if not idle:
            return None
        now, found = time.monotonic(), None
        while idle and found is None:
            conn = idle.pop()
            self._count -= 1
            if conn.reusable(now, self._expiry):
                found = conn
            else:
                conn.abort()
        if not idle:
            del self._idle[key]  # the origins held stay as many as the idle connections
        return found

    async def _connect(self, key: Key, timeout: float) -> _Conn:
        scheme, host, port = key
        name = host.decode("ascii")
        tls = scheme == b"https"
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    name, port, ssl=self._ssl if tls else None, server_hostname=name if tls else None, limit=_READ
                )
        except TimeoutError as e:
            raise httpx.ConnectTimeout(f"no connection to {name}:{port} within {timeout:g}s") from e
        except _CONNECT_ERRORS as e:
            raise httpx.ConnectError(str(e) or type(e).__name__) from e
        tls_object = writer.get_extra_info("ssl_object") if tls else None
        if tls_object is not None and tls_object.selected_alpn_protocol() == "h2":
            writer.transport.abort()
            if len(self._http2) >= self.MAX_HTTP2_ORIGINS:
                del self._http2[next(iter(self._http2))]
            self._http2[key] = None
            raise SpeaksHttp2(f"{name}:{port} chose h2")
        return _Conn(key, reader, writer)

    def _release(self, conn: _Conn) -> None:
        """After an answer read to its end: back to the pool if both sides are done, else closed."""
        state = conn.h11
        if self._closed or state.our_state is not h11.DONE or state.their_state is not h11.DONE:
            conn.close()
            return
        state.start_next_cycle()
        now = conn.idle_since = time.monotonic()
        if self._count >= self._max:
            self._make_room(now)
        if self._count >= self._max:
            conn.close()
            return
        self._idle.setdefault(conn.key, []).append(conn)
        self._count += 1

    def _make_room(self, now: float) -> None:
        """Close the idle connections that expired (to any origin), else the one idle longest."""
        every = [conn for idle in self._idle.values() for conn in idle]
        if not every:
            return
        gone = [conn for conn in every if now - conn.idle_since > self._expiry]
        for conn in gone or [min(every, key=lambda conn: conn.idle_since)]:
            idle = self._idle[conn.key]
            idle.remove(conn)
            if not idle:
                del self._idle[conn.key]
            conn.close()
            self._count -= 1

    async def aclose(self) -> None:
        """Close the idle connections; a connection in use is closed when its answer ends."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        self._count = 0


def _h11_request_bytes(
    state: h11.Connection, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> list[bytes]:
    """
    The request's bytes, head and body, as h11 frames them (the body itself, not a copy: a large
    body is held once). h11 validates the head here (names, values, one Host, method, target)
    and raises LocalProtocolError before any byte is written: outcome/exchange_failures.py reads a
    refusal raised under this function as not_sent.
    """
    out = state.send_with_data_passthrough(h11.Request(method=method, target=target, headers=headers)) or []
    if body:
        out += state.send_with_data_passthrough(h11.Data(data=body)) or []
    return out + (state.send_with_data_passthrough(h11.EndOfMessage()) or [])


async def _next_event(conn: _Conn) -> object:
    """The next event of the answer, reading from the connection as needed; failures as httpx's (after the write)."""
    state = conn.h11
    while True:
        try:
            event = state.next_event()
        except h11.RemoteProtocolError as e:
            raise httpx.RemoteProtocolError(str(e)) from e
        if event is not h11.NEED_DATA:
            if type(event) is h11.ConnectionClosed:
                raise httpx.RemoteProtocolError("the server closed the connection before the answer ended")
            return event
        try:
            data = await conn.reader.read(_READ)
        except _READ_ERRORS as e:
            raise httpx.ReadError(str(e) or type(e).__name__) from e
        if not data and state.their_state is h11.SEND_RESPONSE:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        state.receive_data(data)

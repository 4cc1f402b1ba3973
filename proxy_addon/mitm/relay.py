"""
How an answer the addon reads from the upstream itself reaches the agent as it comes: through
mitmproxy's own streaming, fed from a listener of the addon's on 127.0.0.1.

Why: mitmproxy 12 sends a response set by the `request` hook in one piece; only an answer it
reads from a server itself can stream (`Response.stream`, set in the `responseheaders` hook).
So for an answer that must stream (streaming.py: an MCP tool call's event stream), the
`request` hook sets no response: it points the flow at this relay (`Relay.route`), whose
listener answers mitmproxy with the upstream's head and then the body as the addon passes it
on (`Pipe`); the `responseheaders` hook (`Relay.restore`) sets the flow's request back as the
agent sent it and turns mitmproxy's streaming on. mitmproxy passes the body on as it gets it,
holding none of it (`store_streamed_bodies` off), with its own backpressure.

    relay = Relay()
    await relay.start()                    # once: listens on 127.0.0.1, a port the kernel picks
    pipe = Pipe(limit=1 << 20)
    token = relay.route(flow, head, pipe)  # from the request hook, which then returns
    await pipe.put(data, wanted=..., until=...)   # the body, as it comes (bounded: waits for the agent)
    pipe.end(tail)                         # ...then its end (or pipe.end(broken=True): the agent's stream is cut)
    relay.restore(flow)                    # from the responseheaders hook (or error: the route dropped)
    relay.drop(token)                      # a route nobody will come for (its agent has gone)
    await relay.aclose()

The relay is reached only through a flow the addon routed to it: each route carries a random
token (a header the relay reads, removed again by `restore`), used once; a connection without
a known token gets 404 and is closed. What the relay answers is HTTP/1.1 with a chunked body;
mitmproxy frames it for the agent as it would any upstream's (HTTP/2 included). A flow routed
here shows the relay as its server connection in mitmweb.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets

import h11
from mitmproxy import connection, http

logger = logging.getLogger(__name__)

TOKEN = "x-receipt-relay"  # the header that names a route (set on the flow's request, removed at its answer)
POLL = 0.2  # seconds between two looks at whether the agent is still there, while a full pipe waits
_READ = 65536
_ROUTED = "receipts_relay"  # flow.metadata: the request's target as the agent sent it, while routed here


class Pipe:
    """
    The body of one routed answer, from the addon (`put`, `end`) to the relay's connection
    (`get`): at most about `limit` bytes waiting. `abandon`: nobody will read it any more
    (the agent left, mitmproxy gave up on the flow): what is put is dropped from then on.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.abandoned = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._ended = False
        self._broken = False
        self._changed = asyncio.Event()  # set on every change: the side waiting looks again

    async def put(self, data: bytes, *, wanted: object = None, until: float | None = None) -> None:
        """
        Queue `data`, once there is room: while the pipe is full, wait while `wanted()` (the
        agent is there) and, if given, until `until` (the event loop's clock); past either, the
        pipe is abandoned and `data` dropped.
        """
        if self.abandoned or self._ended or not data:
            return
        loop = asyncio.get_running_loop()
        while self._size >= self.limit and not self.abandoned:
            if (callable(wanted) and not wanted()) or (until is not None and loop.time() >= until):
                self.abandon()
                break
            self._changed.clear()
            wait = POLL if until is None else max(0.0, min(POLL, until - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)
        if self.abandoned:
            return
        self._chunks.append(data)
        self._size += len(data)
        self._changed.set()

    def end(self, tail: bytes = b"", *, broken: bool = False) -> None:
        """The body ends: with `tail` after what was put, or cut (`broken`: the agent sees it cut short)."""
        if self._ended:
            return
        if tail and not self.abandoned and not broken:
            self._chunks.append(tail)
            self._size += len(tail)
        self._ended, self._broken = True, broken
        self._changed.set()

    def abandon(self) -> None:
        """Nobody reads any more: drop what waits, and whatever is put from now on."""
        self.abandoned = True
        self._chunks.clear()
        self._size = 0
        self._changed.set()

    async def get(self) -> bytes | None:
        """
        What waits (joined), as soon as there is some; None at the end. Raises ConnectionAbortedError
        when the body was cut (`end(broken=True)`) or abandoned.
        """
        while True:
            if self._chunks:
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._size = 0
                self._changed.set()
                return data
            if self.abandoned or self._broken:
                raise ConnectionAbortedError("the answer was cut short")
            if self._ended:
                return None
            self._changed.clear()
            await self._changed.wait()


class Relay:
    """The listener answering mitmproxy for routed flows (module docstring)."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._starting: asyncio.Lock | None = None
        self._routes: dict[str, tuple[http.Response, Pipe]] = {}
        self._connections: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> None:
        """Listen on 127.0.0.1 (once; a port the kernel picks)."""
        if self._server is not None:
            return
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self._server is None:
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=_READ)
                self.port = self._server.sockets[0].getsockname()[1]

    def route(self, flow: http.HTTPFlow, head: http.Response, pipe: Pipe) -> str:
        """
        Point the flow at the relay (the request hook then returns without a response): mitmproxy
        sends it here, over plain HTTP, directly (not through an `upstream:` proxy), and gets
        `head`, then what is put in `pipe`, as it comes. The route's token: `drop` forgets it.
        """
        assert self._server is not None, "the relay is not listening"
        token = secrets.token_urlsafe(24)
        self._routes[token] = (head, pipe)
        req = flow.request
        flow.metadata[_ROUTED] = (req.data.scheme, req.data.host, req.data.port, token)
        req.data.scheme, req.data.host, req.data.port = b"http", "127.0.0.1", self.port
        req.headers[TOKEN] = token
        # A connection of its own: not the agent's upstream's (its address, TLS and upstream proxy).
        flow.server_conn = connection.Server(address=None)
        return token

    def drop(self, token: str) -> None:
        """Forget a route mitmproxy will not come for (its pipe was abandoned: the agent has gone)."""
        self._routes.pop(token, None)

    def restore(self, flow: http.HTTPFlow) -> bool:
        """From the responseheaders hook: the request as the agent sent it, the answer streamed (False: not routed)."""
        routed = flow.metadata.pop(_ROUTED, None)
        if routed is None:
            return False
        scheme, host, port, token = routed
        req = flow.request
        req.data.scheme, req.data.host, req.data.port = scheme, host, port
        req.headers.pop(TOKEN, None)
        self._routes.pop(token, None)  # not served (mitmproxy answered otherwise): forgotten
        if flow.response is not None:
            flow.response.stream = True
        return True

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for _, pipe in self._routes.values():
            pipe.abandon()
        self._routes.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from mitmproxy: routed requests, one after another (keep-alive)."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        pipe: Pipe | None = None
        try:
            while True:
                request = await _event(conn, reader)
                if not isinstance(request, h11.Request):
                    return  # the connection closed (or an unexpected event): done with it
                token = (
                    dict((k.lower(), v) for k, v in request.headers).get(TOKEN.encode(), b"").decode("ascii", "replace")
                )
                while not isinstance(event := await _event(conn, reader), h11.EndOfMessage):
                    if isinstance(event, h11.ConnectionClosed):
                        return  # the request's body, which mitmproxy sends (not needed here), cut short

                route = self._routes.pop(token, None)
                if route is None:
                    writer.write(conn.send(h11.Response(status_code=404, headers=[(b"content-length", b"0")])) or b"")
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                    await writer.drain()
                    return
                head, pipe = route
                fields = [(k, v) for k, v in head.headers.fields if k.lower() != b"content-length"]
                fields.append((b"transfer-encoding", b"chunked"))
                response = h11.Response(status_code=head.status_code, reason=head.reason.encode(), headers=fields)
                writer.write(conn.send(response) or b"")
                while (data := await pipe.get()) is not None:
                    writer.write(conn.send(h11.Data(data=data)) or b"")
                    await writer.drain()
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                pipe = None
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (OSError, h11.ProtocolError) as e:  # the answer cut short (ConnectionAbortedError), mitmproxy gone
            logger.debug(f"receipt-proxy: relay connection ended: {type(e).__name__}: {e}")
            if pipe is not None:
                pipe.abandon()  # nobody reads the rest
        finally:
            self._connections.discard(task)
            if pipe is not None:
                writer.transport.abort()  # cut short: mitmproxy sees the body end without its last chunk
            else:
                writer.close()


async def _event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The next h11 event of the request side, reading as needed."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(_READ)
        conn.receive_data(data)

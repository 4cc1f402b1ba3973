"""
Keep-alive connections in the addon's own exchange (proxy_addon/mitm/exchange.py, its HTTP/1.1
pool in mitm/http1.py), against a raw-socket upstream that plays a script per connection and
records every request it reads:

- an idle connection the server closed (a FIN the event loop has already read, or one it has
  not), or on which it sent something unasked (a 408), is never written to: the request goes
  on a new connection, once, and is answered;
- a reused connection the server closes after the request was written is outcome_unknown,
  never not_sent, and the request is never sent again, on this connection or another.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from mitmproxy import http

from proxy_addon.mitm.exchange import Reply, make_client, send
from proxy_addon.outcome.classify import Outcome
from proxy_addon.states import State
from proxy_addon.wire.upstream import Upstream

ANSWER = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Scripted:
    """
    An upstream on 127.0.0.1: connection n (from 0) is handed to `scripts[n]` (a function of the
    server and the socket), each on its own thread. Every request read is kept in `requests`
    as (connection, path).
    """

    def __init__(self, scripts: list[Callable[[Scripted, socket.socket], None]]) -> None:
        self.scripts = scripts
        self.requests: list[tuple[int, str]] = []
        self.closed = threading.Event()  # set by a script once it has closed its connection
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._buffers: dict[int, bytes] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            n, self.accepted = self.accepted, self.accepted + 1
            if n >= len(self.scripts):  # a connection no script expected: read what comes, answer nothing
                threading.Thread(target=self._unexpected, args=(n, conn), daemon=True).start()
                continue
            threading.Thread(target=self.scripts[n], args=(self, conn), daemon=True).start()

    def _unexpected(self, n: int, conn: socket.socket) -> None:
        with conn:
            while self.read_request(n, conn) is not None:
                pass

    def read_request(self, n: int, conn: socket.socket) -> str | None:
        """One whole request (head and Content-Length body) from connection `n`: its path, or None at EOF."""
        conn.settimeout(5)
        data = self._buffers.get(n, b"")
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                data += chunk
            head, data = data.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            length = next((int(v.split(b":", 1)[1]) for v in lines if v.lower().startswith(b"content-length:")), 0)
            while len(data) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                data += chunk
        except OSError:
            return None
        self._buffers[n] = data[length:]
        path = head.split(b" ", 2)[1].decode()
        self.requests.append((n, path))
        return path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def make(*scripts: Callable[[Scripted, socket.socket], None]) -> Scripted:
        servers.append(Scripted(list(scripts)))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def request(url: str) -> http.Request:
    headers: dict[str | bytes, str | bytes] = {"Content-Type": "application/json"}
    return http.Request.make("POST", url, b"{}", headers)


async def once(client, url: str) -> http.Response | Outcome:
    result = await send(client, request(url), deadline=5, cap=1 << 20)
    if isinstance(result, Reply):
        assert result.complete
        return result.response
    return result


def answer_then(after: str) -> Callable[[Scripted, socket.socket], None]:
    """Answer the first request on the connection, keep-alive; then close it, or send a 408 unasked and close later."""

    def script(server: Scripted, conn: socket.socket) -> None:
        with conn:
            assert server.read_request(0, conn) is not None
            conn.sendall(ANSWER)
            if after.startswith("408"):
                if after == "408-later":
                    time.sleep(0.1)  # after the client read the answer: the loop reads the 408, h11 does not
                conn.sendall(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                server.closed.set()  # sent, not yet closed: the client reads the 408 first
                time.sleep(1)
        server.closed.set()

    return script


def answer_all(server: Scripted, conn: socket.socket) -> None:
    with conn:
        while server.read_request(1, conn) is not None:
            conn.sendall(ANSWER)


@pytest.mark.parametrize("how", ["fin-seen-by-the-loop", "fin-not-yet-read", "408-with-the-answer", "408-later"])
async def test_an_idle_connection_the_server_closed_is_never_written_to(scripted, how):
    """
    The second request must not go on the first connection: the server closed it (or told it so
    with a 408). It goes on a new connection, once, and is answered. Were it written on the
    closed connection, the request would be lost and recorded outcome_unknown.
    """
    server = scripted(answer_then(how if how.startswith("408") else "close"), answer_all)
    async with make_client(Upstream()) as client:
        first = await once(client, server.url("/api/first"))
        assert isinstance(first, http.Response) and first.status_code == 201, first
        if how == "fin-not-yet-read":
            # Blocks the event loop: the FIN is in the kernel, and the loop has not read it.
            assert server.closed.wait(5)
            time.sleep(0.05)
        else:
            for _ in range(250):  # the loop reads the FIN, or the 408
                await asyncio.sleep(0.02)
                if server.closed.is_set():
                    break
            await asyncio.sleep(0.05)
        second = await once(client, server.url("/api/second"))
    assert isinstance(second, http.Response), second
    assert second.status_code == 201
    assert server.requests == [(0, "/api/first"), (1, "/api/second")]


def answer_then_drop(mode: str) -> Callable[[Scripted, socket.socket], None]:
    """Answer the first request, keep-alive; read the second whole, then close (FIN) or reset (RST), no answer."""

    def script(server: Scripted, conn: socket.socket) -> None:
        with conn:
            assert server.read_request(0, conn) is not None
            conn.sendall(ANSWER)
            assert server.read_request(0, conn) is not None
            if mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    return script


@pytest.mark.parametrize("mode", ["close", "reset"])
async def test_a_reused_connection_that_breaks_after_the_write_is_outcome_unknown_and_never_resent(scripted, mode):
    """
    The server read the second request on the reused connection, then closed it without an
    answer: the request may have taken effect. It is outcome_unknown, and it is not sent again
    on a new connection (an HTTP client's usual retry of a reused connection that fails).
    """
    server = scripted(answer_then_drop(mode), answer_all)
    async with make_client(Upstream()) as client:
        first = await once(client, server.url("/api/first"))
        assert isinstance(first, http.Response) and first.status_code == 201, first
        second = await once(client, server.url("/api/second"))
        await asyncio.sleep(0.2)  # a second attempt, had there been one, reaches the server
    assert isinstance(second, Outcome), second
    assert second.state is State.OUTCOME_UNKNOWN
    assert second.reason.startswith("outcome unknown: the request may have reached the upstream"), second.reason
    assert server.requests == [(0, "/api/first"), (0, "/api/second")]
    assert server.accepted == 1


@pytest.mark.parametrize("offers", ["h2", "http/1.1"])
async def test_with_http2_on_an_https_upstream_gets_the_protocol_it_chooses_each_write_once(offers, tls_upstream):
    """
    With `http2` on, the exchange offers h2 and http/1.1 by ALPN. An upstream that chooses h2
    is found out on the first connection, which is closed before a byte of the request is
    written; that write and the next go over HTTP/2 (httpcore), each once. One that chooses
    HTTP/1.1 is answered over it.
    """
    from tests.upstream_h2 import H2Upstream

    paths = ["/api/alpn/first", "/api/alpn/second"]
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(H2Upstream(certdir=tls_upstream.certdir)) if offers == "h2" else tls_upstream
        async with make_client(Upstream(ca_file=str(tls_upstream.cert_path), http2=True)) as client:
            answers = [await once(client, up.url + p) for p in paths]
        for p, answer in zip(paths, answers, strict=True):
            assert isinstance(answer, http.Response) and answer.status_code == 201, answer
            assert answer.http_version == ("HTTP/2.0" if offers == "h2" else "HTTP/1.1")
            assert up.seen(p) == 1
            if offers == "h2":
                assert up.protocols(p) == ["HTTP/2"]


def answer_each(server: Scripted, conn: socket.socket) -> None:
    """Answer every request on the connection, keep-alive, until the client closes it (then `closed`)."""
    n = server.accepted - 1
    with conn:
        while server.read_request(n, conn) is not None:
            conn.sendall(ANSWER)
    server.closed.set()


async def test_the_idle_pool_is_bounded_and_keeps_the_newest_connections(scripted):
    """
    With room for 2 idle connections: after writes to origins A and B, a write to C makes room
    by closing the connection idle longest (A's), and C's next write reuses C's connection.
    (A full pool that refused every new idle connection would leave keep-alive off for good.)
    """
    from proxy_addon.mitm.http1 import Http1Pool

    a, b, c = (scripted(answer_each, answer_each) for _ in range(3))
    async with make_client(Upstream()) as client:
        assert client.http1 is not None
        client.http1 = Http1Pool(client.http1._ssl, max_keepalive=2)
        for server in (a, b, c, c):
            answer = await once(client, server.url("/api/bounded"))
            assert isinstance(answer, http.Response) and answer.status_code == 201, answer
        assert a.closed.wait(5), "the connection idle longest was not closed"
        assert not b.closed.is_set()
        assert (a.accepted, b.accepted, c.accepted) == (1, 1, 1)


async def test_an_answer_with_a_large_head_is_read_as_httpcore_read_it(scripted):
    """An answer head of 60 KiB (long cookies, a large CSP) is read: the limit is httpcore's 100 KiB, not h11's 16."""

    def script(server: Scripted, conn: socket.socket) -> None:
        with conn:
            assert server.read_request(0, conn) is not None
            head = ANSWER.replace(b"\r\n\r\n", b"\r\nX-Large: " + b"v" * 60 * 1024 + b"\r\n\r\n", 1)
            conn.sendall(head[: 40 * 1024])  # in two parts: the client holds 40 KiB of an unfinished head
            time.sleep(0.1)
            conn.sendall(head[40 * 1024 :])

    server = scripted(script)
    async with make_client(Upstream()) as client:
        answer = await once(client, server.url("/api/large-head"))
    assert isinstance(answer, http.Response) and answer.status_code == 201, answer
    assert len(answer.headers["x-large"]) == 60 * 1024

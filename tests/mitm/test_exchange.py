"""
The addon's own upstream exchange (proxy_addon/mitm/exchange.py) against the real upstream of
tests/upstream.py: an answer comes back as a mitmproxy Response, a failure as an Outcome
(not_sent when the connection never carried the request, else outcome_unknown), and the
request is sent exactly once whatever happens. The upstream counts what it saw.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from mitmproxy import http

from proxy_addon.mitm.exchange import Reply, make_client
from proxy_addon.mitm.exchange import send as send_once
from proxy_addon.outcome.classify import Outcome
from proxy_addon.states import State
from proxy_addon.wire.upstream import Upstream

BODY = b'{"title": "hello"}'


async def send(client, req: http.Request, *, deadline: float, cap: int = 1 << 20) -> http.Response | Outcome:
    """exchange.send, with these small answers read whole: the Response, or the Outcome."""
    result = await send_once(client, req, deadline=deadline, cap=cap)
    if isinstance(result, Reply):
        assert result.complete, "a small answer is read whole"
        return result.response
    return result


def path() -> str:
    return f"/api/x{uuid.uuid4().hex[:12]}/things"


def request(url: str, headers: dict[str, str] | None = None, content: bytes = BODY) -> http.Request:
    fields: dict[str | bytes, str | bytes] = {"Content-Type": "application/json"}
    fields.update((headers or {}).items())  # pairs: a dict[str, str] is not a dict of str | bytes
    return http.Request.make("POST", url, content, fields)


def received(up, p: str) -> dict:
    """The one write the upstream saw at `p` (fails if it saw another number)."""
    writes = [r for r in up.requests if r["method"] == "POST" and r["path"] == p]
    assert len(writes) == 1, f"the upstream saw {len(writes)} writes at {p}"
    return writes[0]


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound but not listening: connections to it are refused, and no other process can take it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


# --- answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "status"), [("ok", 201), ("slow", 201), ("409", 409), ("500", 500), ("503", 503)])
async def test_an_answer_comes_back_as_a_response(upstream, fault, status):
    p = path()
    upstream.plan(p, fault)
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"{upstream.url}{p}"), deadline=5)
    assert isinstance(result, http.Response), result
    assert result.status_code == status
    assert result.raw_content is not None
    assert result.headers.get_all("content-length") == [str(len(result.raw_content))]
    if status == 201:
        assert result.json() == {"id": 1, "path": p, "received": len(BODY)}
    else:
        assert result.json() == {"error": f"status {fault}"}
    assert received(upstream, p)["body"] == BODY
    assert upstream.seen(p) == 1


async def test_a_stale_content_length_is_not_forwarded(upstream):
    p = path()
    req = request(f"{upstream.url}{p}")
    req.headers["Content-Length"] = "999"  # the agent's framing; the new exchange frames the body itself
    async with make_client(Upstream()) as client:
        result = await send(client, req, deadline=5)
    assert isinstance(result, http.Response) and result.status_code == 201
    got = received(upstream, p)
    assert (got["body"], got["headers"]["Content-Length"]) == (BODY, str(len(BODY)))


# Each hop-by-hop request header (RFC 9110 §7.6.1) with an end-to-end header beside it that must arrive.
HOP_BY_HOP = [
    pytest.param({"Keep-Alive": "timeout=5"}, ["Keep-Alive"], id="keep-alive"),
    pytest.param({"Proxy-Connection": "keep-alive"}, ["Proxy-Connection"], id="proxy-connection"),
    pytest.param({"Proxy-Authorization": "Basic dXNlcjpwYXNz"}, ["Proxy-Authorization"], id="proxy-authorization"),
    pytest.param({"TE": "trailers"}, ["TE"], id="te"),
    pytest.param({"Trailer": "X-Checksum"}, ["Trailer"], id="trailer"),
    pytest.param({"Upgrade": "h2c", "Connection": "Upgrade"}, ["Upgrade"], id="upgrade"),
    pytest.param({"Connection": "close"}, [], id="connection-close"),
    # A header the Connection header names is hop-by-hop too (RFC 9110 §7.6.1: "a proxy MUST ...
    # remove any header field(s) with the same name as the connection-option").
    pytest.param({"Connection": "X-Hop", "X-Hop": "1"}, ["X-Hop"], id="named-in-connection"),
]


@pytest.mark.parametrize(("hop", "absent"), HOP_BY_HOP)
async def test_hop_by_hop_request_headers_are_not_forwarded(upstream, hop, absent):
    p = path()
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"{upstream.url}{p}", {**hop, "X-End-To-End": "kept"}), deadline=5)
    assert isinstance(result, http.Response) and result.status_code == 201
    got = {k.lower(): v for k, v in received(upstream, p)["headers"].items()}
    assert got["x-end-to-end"] == "kept"
    for name in absent:
        assert name.lower() not in got, f"{name} reached the upstream: {got}"
    # The new connection says what it wants itself: never the agent's "close" or "Upgrade".
    assert got.get("connection", "keep-alive").lower() == "keep-alive"


async def test_the_exchange_adds_no_request_headers_of_its_own(upstream):
    """
    The upstream gets the agent's end-to-end headers, not httpx's defaults: an agent that sent no
    Accept-Encoding (curl, without --compressed) must not be answered with a gzip body it did not ask for.
    """
    p = path()
    sent = {"Content-Type": "application/json", "X-Agent": "a1"}
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"{upstream.url}{p}", sent), deadline=5)
    assert isinstance(result, http.Response) and result.status_code == 201
    got = {k.lower() for k in received(upstream, p)["headers"]}
    # Host and Content-Length frame the new exchange; Connection is its own hop-by-hop header.
    added = got - {k.lower() for k in sent} - {"host", "content-length", "connection"}
    assert added == set(), f"headers the agent never sent reached the upstream: {sorted(added)}"


async def test_a_cookie_an_upstream_sets_is_never_sent_back_by_the_exchange():
    """
    The exchange keeps no cookie jar: a `Set-Cookie` in one agent's answer goes to that agent,
    never into another agent's request (httpx's client kept one, and sent it with every later
    write to that host, whoever sent it).
    """
    import threading

    heads: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while len(heads) < 2:  # each request: a head, then a 2-byte body (which may come in a later segment)
                while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 2:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                data = data[2:]
                heads.append(head)
                conn.sendall(
                    b"HTTP/1.1 201 Created\r\nSet-Cookie: session=agent-a; Path=/\r\nContent-Length: 2\r\n\r\n{}"
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/api/things"
    try:
        async with make_client(Upstream()) as client:
            first = await send(client, request(url, {"X-Agent": "a"}, content=b"{}"), deadline=5)
            assert isinstance(first, http.Response) and first.headers.get("set-cookie") == "session=agent-a; Path=/"
            second = await send(client, request(url, {"X-Agent": "b"}, content=b"{}"), deadline=5)
            assert isinstance(second, http.Response) and second.status_code == 201
    finally:
        server.close()
        thread.join(timeout=5)
    assert len(heads) == 2, heads
    assert b"x-agent: b" in heads[1].lower()
    assert b"cookie" not in heads[1].lower(), heads[1]


# --- failures --------------------------------------------------------------------------------


async def test_a_refused_connection_is_not_sent(refusing_port):
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"http://127.0.0.1:{refusing_port}/api/things"), deadline=5)
    assert isinstance(result, Outcome)
    assert result.state is State.NOT_SENT
    assert result.timed_out is False
    assert result.reason.startswith("not sent: the connection to the upstream was never established")
    assert result.http_status is None


@pytest.mark.parametrize("fault", ["drop", "lost", "reset", "half"])
async def test_a_broken_exchange_after_the_request_is_outcome_unknown(upstream, fault):
    p = path()
    upstream.plan(p, fault)
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"{upstream.url}{p}"), deadline=5)
    assert isinstance(result, Outcome), result
    assert result.state is State.OUTCOME_UNKNOWN
    assert result.timed_out is False
    assert result.reason.startswith("outcome unknown: the request may have reached the upstream")
    assert upstream.seen(p) == 1  # sent once, never retried
    assert received(upstream, p)["fault"] == fault


async def test_a_hang_past_the_deadline_is_outcome_unknown_and_timed_out(upstream):
    p = path()
    upstream.plan(p, "hang")  # holds the connection for 8 s
    started = time.monotonic()
    async with make_client(Upstream()) as client:
        result = await send(client, request(f"{upstream.url}{p}"), deadline=0.5)
    elapsed = time.monotonic() - started
    assert isinstance(result, Outcome), result
    assert (result.state, result.timed_out) == (State.OUTCOME_UNKNOWN, True)
    assert "0.5s" in result.reason
    assert 0.5 <= elapsed < 5  # 0.6 s on a quiet machine; the deadline not kept: the 8 s hang (and timed_out False)
    assert upstream.seen(p) == 1
    assert upstream.commits(p) == 1  # it did take effect: exactly why the state is outcome_unknown


# --- TLS -------------------------------------------------------------------------------------


async def test_an_untrusted_tls_upstream_is_not_sent(tls_upstream):
    p = path()
    async with make_client(Upstream()) as client:  # certifi's bundle: the test CA is not in it
        result = await send(client, request(f"{tls_upstream.url}{p}"), deadline=5)
    assert isinstance(result, Outcome), result
    assert result.state is State.NOT_SENT
    assert "certificate verify failed" in result.reason.lower()
    assert tls_upstream.seen(p) == 0  # the connection never carried the request


async def test_a_tls_upstream_with_its_ca_answers(tls_upstream):
    p = path()
    async with make_client(Upstream(ca_file=str(tls_upstream.cert_path))) as client:
        result = await send(client, request(f"{tls_upstream.url}{p}"), deadline=5)
    assert isinstance(result, http.Response), result
    assert result.status_code == 201
    assert result.json()["path"] == p
    assert result.raw_content is not None
    assert result.headers["content-length"] == str(len(result.raw_content))
    assert tls_upstream.seen(p) == 1


# --- the send guard (send_guard.py): asked on the connection, just before the first byte ----------


def refusing_guard(asked: list) -> Callable[[], str | None]:
    def guard() -> str:
        asked.append(time.monotonic())
        return "this proxy's lease is known to hold for 0.0s more"

    return guard


async def test_a_guard_that_refuses_stops_the_request_on_its_open_connection_before_its_first_byte():
    """The guard is asked once the connection is open, and a refusal writes nothing: not_sent."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    seen: dict = {"connections": 0, "bytes": b""}

    def serve() -> None:
        conn, _ = server.accept()
        seen["connections"] += 1
        conn.settimeout(5)
        with conn:
            try:
                while chunk := conn.recv(65536):
                    seen["bytes"] += chunk
            except OSError:  # reset: the exchange aborts the connection it will not use
                pass
        seen["closed"] = True

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    asked: list = []
    try:
        async with make_client(Upstream()) as client:
            result = await send_once(
                client,
                request(f"http://127.0.0.1:{server.getsockname()[1]}/api/things"),
                deadline=5,
                cap=1 << 20,
                guard=refusing_guard(asked),
            )
        thread.join(timeout=10)
    finally:
        server.close()
    assert isinstance(result, Outcome), result
    assert (result.state, result.timed_out) == (State.NOT_SENT, False)
    assert result.reason == "not sent: this proxy's lease is known to hold for 0.0s more"
    assert len(asked) == 1
    assert seen == {"connections": 1, "bytes": b"", "closed": True}  # connected, then closed: not a byte of it


async def test_a_guard_that_refuses_on_a_kept_alive_connection_writes_nothing(upstream):
    p = path()
    asked: list = []
    async with make_client(Upstream()) as client:
        first = await send(client, request(f"{upstream.url}{p}"), deadline=5)
        assert isinstance(first, http.Response) and first.status_code == 201
        before = upstream.received
        result = await send_once(
            client, request(f"{upstream.url}{p}"), deadline=5, cap=1 << 20, guard=refusing_guard(asked)
        )
        after = upstream.received
        allowed = await send_once(client, request(f"{upstream.url}{p}"), deadline=5, cap=1 << 20, guard=lambda: None)
    assert isinstance(result, Outcome) and result.state is State.NOT_SENT, result
    assert len(asked) == 1
    assert after == before  # not a byte of the refused request
    assert isinstance(allowed, Reply) and allowed.response.status_code == 201  # a guard that allows: sent
    assert upstream.seen(p) == 2

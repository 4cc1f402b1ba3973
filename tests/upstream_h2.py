"""
A real HTTP/2 upstream API over TLS on 127.0.0.1 (ALPN h2), with faults at the frame level.

    with H2Upstream(certdir=tls_upstream.certdir) as up:   # the certificate the test proxies trust
        up.plan("/api/b1/plain", "refused")                   # the next write's stream is refused
        ...
        assert up.commits("/api/b1/plain") == 0
        assert up.protocols("/api/b1/plain") == ["HTTP/2"]

Written with the `h2` library on plain sockets (a thread per connection), so each fault is
exactly the frames RFC 9113 describes. Faults, one per write, in the order planned (then "ok"):
    ok          commit, answer 201 with {"id": n, ...}
    refused     RST_STREAM(REFUSED_STREAM) on the write's stream, without committing (§8.7: not processed)
    goaway      without committing, GOAWAY(NO_ERROR) whose last-stream-id is the last stream this
                connection processed (0 on a new connection), so it excludes the write's stream; then close
    goaway-after  commit, then GOAWAY(NO_ERROR) whose last-stream-id is the write's stream (it may
                have been processed, and was); then close
    reset       commit, then RST_STREAM(INTERNAL_ERROR)
    cancel      commit, then RST_STREAM(CANCEL)
    drop        commit, then close the TCP connection without a frame more
A client that negotiates HTTP/1.1 instead (ALPN http/1.1, or none) is served too, with "ok" only
(h11): `protocols(path)` tells which protocol each write came over ("HTTP/2" or "HTTP/1.1").
The upstream counts commits itself, per path, as tests/upstream.py does; `seen(path)` counts the
writes that reached it, committed or not (a write sent twice shows here), each with its
connection and stream (`requests`). Reads (GET) answer 200 with what the path's commits created.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections import defaultdict
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11

from tests.upstream import make_self_signed_cert

FAULTS = ("ok", "refused", "goaway", "goaway-after", "reset", "cancel", "drop")


class H2Upstream:
    def __init__(self, *, certdir: Path, linger: float = 5.0):
        self.certdir = certdir
        self.linger = linger  # how long a closing connection waits for the peer to close first
        self.lock = threading.Lock()
        self._plans: dict[str, list[str]] = defaultdict(list)
        self._commits: dict[str, int] = defaultdict(int)
        self.items: dict[str, list[dict]] = {}
        self.requests: list[dict] = []  # every request: path, method, protocol, connection, stream, fault
        self.connections = 0  # TLS connections accepted (mitmproxy's own eager ones count too)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.cert_path: Path | None = None

    # --- control ---------------------------------------------------------------------------

    def plan(self, path: str, *faults: str) -> None:
        assert all(f in FAULTS for f in faults), faults
        with self.lock:
            self._plans[path].extend(faults)

    def commits(self, path: str) -> int:
        with self.lock:
            return self._commits[path]

    def writes(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["method"] not in ("GET", "HEAD") and r["path"] == path]

    def seen(self, path: str) -> int:
        """Writes that reached `path`, committed or not."""
        return len(self.writes(path))

    def protocols(self, path: str) -> list[str]:
        """The protocol each write to `path` came over, in order."""
        return [r["protocol"] for r in self.writes(path)]

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # --- serving ---------------------------------------------------------------------------

    def __enter__(self) -> H2Upstream:
        cert, key = make_self_signed_cert(self.certdir)
        self.cert_path = cert
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        self._tls.set_alpn_protocols(["h2", "http/1.1"])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        assert self._listener is not None
        self._listener.close()

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, raw)

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            sock = self._tls.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):  # a client that did not trust us, or went away
            raw.close()
            return
        with self.lock:
            self.connections += 1
            number = self.connections
        sock.settimeout(0.2)
        try:
            if sock.selected_alpn_protocol() == "h2":
                _H2Connection(self, sock, number).serve()
            else:
                self._serve_h11(sock, number)
        except OSError:
            pass
        finally:
            sock.close()

    def _commit(self, path: str, body: bytes) -> int:
        """Commit a write (self.lock held): its number."""
        self._commits[path] += 1
        n = self._commits[path]
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            doc = {}
        self.items.setdefault(path, []).append({**(doc if isinstance(doc, dict) else {}), "id": n})
        return n

    def handle(
        self, method: str, target: str, body: bytes, protocol: str, connection: int, stream: int | None
    ) -> tuple[str, int, bytes]:
        """The fault for a request, and the answer's status and body when it has one."""
        path = target.split("?")[0]
        with self.lock:
            if method in ("GET", "HEAD"):
                self.requests.append(
                    {
                        "path": path,
                        "method": method,
                        "protocol": protocol,
                        "connection": connection,
                        "stream": stream,
                        "fault": None,
                    }
                )
                return "ok", 200, json.dumps(self.items.get(path, [])).encode()
            fault = self._plans[path].pop(0) if self._plans[path] else "ok"
            self.requests.append(
                {
                    "path": path,
                    "method": method,
                    "protocol": protocol,
                    "connection": connection,
                    "stream": stream,
                    "fault": fault,
                    "size": len(body),
                }
            )
            if fault in ("refused", "goaway"):
                return fault, 0, b""
            n = self._commit(path, body)
        return fault, 201, json.dumps({"id": n, "path": path, "received": len(body)}).encode()

    def _serve_h11(self, sock: ssl.SSLSocket, number: int) -> None:
        """HTTP/1.1, for a client that did not negotiate h2: every write is "ok"."""
        conn = h11.Connection(h11.SERVER)
        request, body = None, b""
        while not self._stop.is_set():
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                request, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                planned = self._plans.get(request.target.decode().split("?")[0]) or []
                if planned and planned[0] != "ok" and request.method not in (b"GET", b"HEAD"):
                    raise AssertionError(f"fault {planned[0]!r} needs HTTP/2; this client spoke HTTP/1.1")
                _, status, payload = self.handle(
                    request.method.decode(), request.target.decode(), body, "HTTP/1.1", number, None
                )
                sock.sendall(
                    conn.send(
                        h11.Response(
                            status_code=status,
                            headers=[("content-type", "application/json"), ("content-length", str(len(payload)))],
                        )
                    )
                )
                sock.sendall(conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
                request = None
            elif isinstance(event, h11.ConnectionClosed):
                return


class _H2Connection:
    """One HTTP/2 connection, served on its own thread."""

    def __init__(self, up: H2Upstream, sock: ssl.SSLSocket, number: int):
        self.up, self.sock, self.number = up, sock, number
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.streams: dict[int, dict] = {}
        self.processed = 0  # the highest stream id this connection processed (answered or committed)

    def serve(self) -> None:
        self.conn.initiate_connection()
        self.flush()
        while not self.up._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.flush()
                return
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    self.streams[event.stream_id] = {"headers": dict(event.headers or []), "body": b""}
                elif isinstance(event, h2.events.DataReceived):
                    if event.stream_id in self.streams:
                        self.streams[event.stream_id]["body"] += event.data or b""
                    self.conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    if self.respond(event.stream_id) == "closed":
                        return
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.flush()
                    return
            self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def respond(self, stream_id: int) -> str | None:
        """Answer a request whose stream ended: "closed" when the fault closed the connection."""
        request = self.streams.pop(stream_id)
        headers = {
            k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in request["headers"].items()
        }
        fault, status, payload = self.up.handle(
            headers[":method"], headers[":path"], request["body"], "HTTP/2", self.number, stream_id
        )
        if fault == "refused":
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return None
        if fault in ("goaway", "goaway-after"):
            last = self.processed if fault == "goaway" else stream_id
            self.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR, last_stream_id=last)
            self.close_gracefully()
            return "closed"
        self.processed = max(self.processed, stream_id)
        if fault in ("reset", "cancel"):
            code = h2.errors.ErrorCodes.INTERNAL_ERROR if fault == "reset" else h2.errors.ErrorCodes.CANCEL
            self.conn.reset_stream(stream_id, code)
            return None
        if fault == "drop":
            self.sock.shutdown(socket.SHUT_RDWR)
            return "closed"
        self.conn.send_headers(
            stream_id,
            [(":status", str(status)), ("content-type", "application/json"), ("content-length", str(len(payload)))],
        )
        self.conn.send_data(stream_id, payload, end_stream=True)
        return None

    def close_gracefully(self) -> None:
        """Send what is pending (the GOAWAY), stop writing, and read until the peer closes (or `linger`)."""
        self.flush()
        self.sock.shutdown(socket.SHUT_WR)
        deadline = threading.Event()
        timer = threading.Timer(self.up.linger, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                try:
                    if not self.sock.recv(65536):
                        return
                except TimeoutError:
                    continue
        finally:
            timer.cancel()

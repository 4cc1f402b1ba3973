"""
The tiny API `receipts demo` talks to: an HTTP server on 127.0.0.1, on a port the kernel picks,
on a thread of this process.

    POST /things {"title": ...}   commits a thing {"id": n, "title": ...}; answers 201 with it
    GET  /things                  lists every thing committed

Its faults are the demo's story, each once and in order: the first write is committed and then its
connection is closed without an answer (the agent cannot tell that it happened), and the first read
answers 503 with `Retry-After: 1` (the API has not recovered yet). `writes` counts the committed
writes: what the proxy exists to keep at one.

Each connection carries one request (HTTP/1.0), so no connection outlives its answer, and `stop()`
joins the server's thread and every handler thread: nothing of it is left running.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BODY_MAX = 64 * 1024  # a demo write is a title; anything larger is refused (413)


class DemoApi:
    """The demo's API; `with DemoApi() as api:` starts it and stops it."""

    def __init__(self, *, drop_writes: int = 1, fail_reads: int = 1) -> None:
        self.things: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._drop_writes = drop_writes  # writes still to commit and then drop
        self._fail_reads = fail_reads  # reads still to answer 503
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def writes(self) -> int:
        """How many writes the API committed."""
        with self.lock:
            return len(self.things)

    @property
    def url(self) -> str:
        assert self._server is not None, "the API is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> DemoApi:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = False  # server_close() joins every handler thread
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="receipts-demo-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()  # serve_forever returns
        self._server.server_close()  # closes the socket, joins the handler threads
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> DemoApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write(self, title: Any) -> tuple[dict[str, Any], bool]:
        """Commit a thing; returns it, and whether its connection is to be dropped instead of answered."""
        with self.lock:
            thing = {"id": len(self.things) + 1, "title": title}
            self.things.append(thing)
            drop, self._drop_writes = self._drop_writes > 0, max(0, self._drop_writes - 1)
        return thing, drop

    def read(self) -> list[dict[str, Any]] | None:
        """Every thing committed, or None: this read fails (503)."""
        with self.lock:
            if self._fail_reads > 0:
                self._fail_reads -= 1
                return None
            return list(self.things)


def _handler(api: DemoApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection
        timeout = 30  # a client that sends nothing does not hold a thread for long

        def log_message(self, format: str, *args: Any) -> None:  # the demo prints its own lines
            pass

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/things":
                self._json(404, {"error": "not found"})
                return
            things = api.read()
            if things is None:
                self._json(503, {"error": "temporarily unavailable"}, {"Retry-After": "1"})
            else:
                self._json(200, things)

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/things":
                self._json(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= BODY_MAX:
                self._json(413 if length else 400, {"error": 'send a JSON body: {"title": ...}'})
                return
            try:
                title = json.loads(self.rfile.read(length)).get("title")
            except (ValueError, AttributeError):
                self._json(400, {"error": 'send a JSON body: {"title": ...}'})
                return
            thing, drop = api.write(title)
            if drop:  # committed; the connection closes before a byte of the answer
                self.close_connection = True
                with contextlib.suppress(OSError):  # the proxy has gone already
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._json(201, thing)

        def _json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
            content = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(content)

    return Handler

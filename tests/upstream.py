"""
A real upstream API on 127.0.0.1 that commits writes and injects faults.

    with Upstream() as up:                     # or Upstream(tls=True)
        up.plan("/api/articles", "drop")       # the next request commits, then drops the connection
        ...
        assert up.commits("/api/articles") == 1

Faults, one per request, in the order planned (then "ok"):
    ok        commit, answer 201 with {"id": n, ...}
    slow      commit, wait a second, then answer like ok
    late      commit, wait 2.5 seconds (past a 1 s client timeout), then answer like ok
    drop      commit, then close the connection without answering
    lost      close the connection without committing or answering (the write never took effect)
    hang      commit, then hold the connection (up to `hang_seconds`), then close
    held      commit, then wait until `let_go(path)` (up to `hang_seconds`), then answer like ok
    commit_late  wait until `let_go(path)` (up to `hang_seconds`), then commit (even if the client has
              gone meanwhile), then answer like ok: an upstream slow to commit
    half      commit, then send half a response and close
    reset     commit, then reset the connection (RST)
    400 / 404 / 409 / 429   refuse without committing
    500 / 502 / 503         commit, then answer with that status
    large     commit, answer 201 with a JSON body of `large_bytes` bytes (3 MiB): {"id": n, "pad": "xx..."}
    mint      commit, answer 201 with secrets the write made: {"id": n, "api_key": MINTED_KEY}, an
              `X-Api-Token: MINTED_TOKEN` header and a Set-Cookie with it (the marker secrets sweep looks for both)
    endless   commit, answer 200 and stream a chunked body without end, until the peer closes the
              connection or `endless_seconds` pass: `up.endless[path]` says how many bytes were
              written, and whether the peer closed the connection or stopped reading (5 s) without closing;
              `up.endless_rate` (bytes per second, None: as fast as it can) slows it
Upstream(keep_bodies=False) records each write's size and sha256 but not its body (large bodies).
Reads: GET of a write path lists what its commits created (`[{"id": 1, ...}]`), in pages when
it asks (`?limit=N&starting_after=<id>`: Stripe's has_more, newest first; `?per_page=N&page=k`:
a Link rel="next" header; both newest first);
GET of `<path>/<id>` answers that item or 404. `plan_read(path, "500")` or "hang" breaks a read
("held" answers it once `let_go(path)` is called);
"deepjson", "badutf8" and "notjson" answer 200 with a body that cannot be judged; a read's "429"
answers with `Retry-After: 2` (READ_RETRY_AFTER). `reads_at_once(path)`: the reads of a path in
progress now and the most at once (a held read counts while it waits).
The upstream counts commits itself, per path: tests never guess. `NginxUpstream` routes (and
counts) every spelling of a path as nginx does: `//api/./thing%73` is `/api/things`.
`DecodingUpstream` decodes a request body's Content-Encoding (gzip, deflate, br, zstd) before reading it.
`OverrideUpstream` handles a request as the method its X-HTTP-Method-Override (or X-HTTP-Method,
X-Method-Override) names, as Rack and Express's method-override do: a GET naming POST commits.
`up.received` counts the bytes read from every connection (a request refused before sending adds none).
`ServletUpstream` routes as Tomcat, Jetty and Spring do: the `;` path parameters of every segment
removed, then dot segments: `/api/b/things;jsessionid=1` and `/api/b/x/..;/things` are `/api/b/things`.
`FlaskUpstream` is a real Flask app on Werkzeug's own server (not an Upstream): it drops a fragment
sent in the request target, as Werkzeug does. `Upstream(host="127.0.0.2")` listens on another loopback
address (its certificate names 127.0.0.2 too).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import ipaddress
import json
import socket
import ssl
import struct
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer

# Secrets an upstream mints in its answer to a write (the "mint" fault): never stored in clear.
MINTED_KEY = "sk_live_MINTED-KEY-9d4c1e"
MINTED_TOKEN = "tok_MINTED-TOKEN-7a2b3f"


class Upstream:
    def __init__(
        self,
        *,
        tls: bool = False,
        certdir: Path | None = None,
        hang_seconds: float = 8.0,
        port: int = 0,
        endless_seconds: float = 30.0,
        keep_bodies: bool = True,
        large_bytes: int = 3 * 1024 * 1024,
        host: str = "127.0.0.1",
    ):
        self.tls = tls
        self.host = host
        self.large_bytes = large_bytes
        self.endless_seconds = endless_seconds
        self.endless_rate: float | None = None
        self.keep_bodies = keep_bodies
        self.endless: dict[str, dict] = {}  # path → {"sent": bytes, "peer_closed", "stalled", "done": bool}
        self._port = port
        self.certdir = certdir
        self.hang_seconds = hang_seconds
        self._plans: dict[str, list[str]] = defaultdict(list)
        self._read_plans: dict[str, list[str]] = defaultdict(list)
        self.items: dict[str, list[dict]] = {}  # what each path's committed writes created, for list reads
        self._commits: dict[str, int] = defaultdict(int)
        self.requests: list[dict] = []
        self.received = 0  # bytes read from all connections, heads and bodies (a request refused before sending: none)
        self.lock = threading.Lock()
        self.release = threading.Event()  # set to end every hang early
        self._held: dict[str, threading.Event] = defaultdict(threading.Event)  # "held" writes wait for let_go(path)
        self._reading: dict[str, int] = defaultdict(int)  # path → reads (GET/HEAD) in progress, not yet answered
        self._reads_peak: dict[str, int] = defaultdict(int)  # path → the most reads in progress at once
        self.server: ThreadingHTTPServer | None = None
        self.cert_path: Path | None = None

    # --- control ---------------------------------------------------------------------------

    def plan(self, path: str, *faults: str) -> None:
        with self.lock:
            self._plans[path].extend(faults)

    def plan_read(self, path: str, *faults: str) -> None:
        """Faults for GET reads of `path`: "hang" or a status such as "500"."""
        with self.lock:
            self._read_plans[path].extend(faults)

    def content(self, encoding: str | None, body: bytes) -> bytes:
        """The body as the upstream reads it: as sent here (DecodingUpstream decodes Content-Encoding)."""
        return body

    def let_go(self, path: str) -> None:
        """Answer the writes and reads of `path` that a "held" fault holds (and later ones at once)."""
        with self.lock:
            event = self._held[path]
        event.set()

    def reads(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r["method"] == "GET" and self.route(r["path"]) == path)

    def reads_at_once(self, path: str) -> tuple[int, int]:
        """Reads of `path` in progress now, and the most ever in progress at once. A read counts from
        its arrival until just before its answer is written (a "held" or "hang" read: while it waits)."""
        with self.lock:
            return self._reading[path], self._reads_peak[path]

    def commits(self, path: str) -> int:
        with self.lock:
            return self._commits[path]

    def seen(self, path: str) -> int:
        """Writes (anything but GET and HEAD) that reached `path`, committed or not."""
        with self.lock:
            return sum(1 for r in self.requests if r["method"] not in ("GET", "HEAD") and self.route(r["path"]) == path)

    def route(self, target: str) -> str:
        """The path a request target is routed (and counted) by: here, the path as sent."""
        return target.split("?")[0]

    def method_of(self, handler: BaseHTTPRequestHandler) -> str:
        """The method a request is handled as: its request line's here (OverrideUpstream reads override headers)."""
        return handler.command

    @property
    def port(self) -> int:
        assert self.server
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def __enter__(self) -> Upstream:
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                # every byte read from the connection counts in up.received; _Counted passes the rest to the stream
                self.rfile = cast(io.BufferedIOBase, _Counted(self.rfile, up))

            def log_message(self, *args):  # keep test output quiet
                pass

            def parse_request(self):  # then do_<command> handles it: the method up.method_of says
                if not super().parse_request():
                    return False
                self.command = up.method_of(self)
                return True

            def do_GET(self):
                path = up.route(self.path)
                with up.lock:
                    up.requests.append(
                        {"path": self.path, "method": "GET", "headers": dict(self.headers), "body": b"", "fault": None}
                    )
                    fault = up._read_plans[path].pop(0) if up._read_plans[path] else "ok"
                    items = list(up.items.get(path, []))
                    parent, _, last = path.rpartition("/")
                    item = next((i for i in up.items.get(parent, []) if str(i["id"]) == last), None)
                    up._reading[path] += 1
                    up._reads_peak[path] = max(up._reads_peak[path], up._reading[path])
                if fault == "held":  # plan_read(path, "held"): wait for let_go(path), then answer as usual
                    with up.lock:
                        held = up._held[path]
                    held.wait(up.hang_seconds)
                elif fault == "hang":
                    up.release.wait(up.hang_seconds)
                with up.lock:  # no longer in progress: from here it is answered (or closed, for "hang")
                    up._reading[path] -= 1
                if fault == "hang":
                    self._close()
                elif fault.isdigit():  # a read's 429 says when to ask again
                    self._answer(int(fault), {"error": f"status {fault}"}, READ_RETRY_AFTER.get(fault))
                elif fault in UNJUDGEABLE:
                    self._raw(200, UNJUDGEABLE[fault])
                elif (paged := _paged(self.path, items, up.url)) is not None:  # ?limit= or ?per_page=
                    self._answer(200, *paged)
                elif items or path in up.items:
                    self._answer(200, items)
                elif item is not None:
                    self._answer(200, item)
                elif last.isdigit():
                    self._answer(404, {"error": "not found"})
                else:
                    self._answer(200, [])

            do_HEAD = do_GET

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                body = up.content(self.headers.get("Content-Encoding"), body)
                path = up.route(self.path)

                def commit() -> int:  # under up.lock
                    up._commits[path] += 1
                    n = up._commits[path]
                    try:
                        doc = json.loads(body) if body and up.keep_bodies else {}
                    except ValueError:
                        doc = {}
                    up.items.setdefault(path, []).append({**(doc if isinstance(doc, dict) else {}), "id": n})
                    return n

                with up.lock:
                    fault = up._plans[path].pop(0) if up._plans[path] else _query_fault(self.path)
                    up.requests.append(
                        {
                            "path": self.path,
                            "target": self.requestline.split(" ")[1],  # as sent ('//' too)
                            "method": self.command,
                            "headers": dict(self.headers),
                            "body": body if up.keep_bodies else b"",
                            "fault": fault,
                            "size": len(body),
                            "sha256": hashlib.sha256(body).hexdigest(),
                        }
                    )
                    if fault not in ("lost", "commit_late") and (not fault.isdigit() or int(fault) >= 500):
                        n = commit()
                    late = up._held[path] if fault == "commit_late" else None
                if late is not None:  # commits only once let go, whether or not the client is still there
                    late.wait(up.hang_seconds)
                    with up.lock:
                        n = commit()
                    fault = "ok"
                if fault == "ok":
                    self._answer(201, {"id": n, "path": path, "received": len(body)})
                elif fault.isdigit():
                    extra = {"Retry-After": "1"} if fault == "429" else {}
                    self._answer(int(fault), {"error": f"status {fault}"}, extra)
                elif fault in ("slow", "late"):  # late: longer than the tests' 1 s client timeout
                    up.release.wait(1.0 if fault == "slow" else 2.5)
                    self._answer(201, {"id": n, "path": path, "received": len(body)})
                elif fault == "held":
                    with up.lock:
                        held = up._held[path]
                    held.wait(up.hang_seconds)
                    self._answer(201, {"id": n, "path": path, "received": len(body)})
                elif fault in ("drop", "lost"):
                    self._close()
                elif fault == "hang":
                    up.release.wait(up.hang_seconds)
                    self._close()
                elif fault == "half":
                    self.wfile.write(
                        b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"id": '
                    )
                    self.wfile.flush()
                    self._close()
                elif fault == "mint":  # an API key created, a session token issued
                    self._answer(
                        201,
                        {"id": n, "api_key": MINTED_KEY},
                        {"X-Api-Token": MINTED_TOKEN, "Set-Cookie": f"session={MINTED_TOKEN}"},
                    )
                elif fault == "large":
                    head = json.dumps({"id": n, "pad": ""}).encode()[:-2]
                    self._raw(201, head + b"x" * (up.large_bytes - len(head) - 2) + b'"}')
                elif fault == "endless":
                    self._endless(path)
                elif fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self._close()
                else:
                    raise ValueError(f"unknown fault {fault!r}")

            do_PUT = do_PATCH = do_DELETE = do_POST

            def _endless(self, path: str) -> None:
                """200, then a chunked body that never ends: until the peer closes, or endless_seconds pass."""
                state = up.endless[path] = {"sent": 0, "peer_closed": False, "stalled": False, "done": False}
                chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                self.connection.settimeout(5.0)
                start = time.monotonic()
                deadline = start + up.endless_seconds
                try:
                    while time.monotonic() < deadline and not up.release.is_set():
                        self.wfile.write(chunk)
                        state["sent"] += 65536
                        if up.endless_rate:
                            time.sleep(max(0.0, start + state["sent"] / up.endless_rate - time.monotonic()))
                except TimeoutError:  # the peer stopped reading for 5 s but kept the connection open
                    state["stalled"] = True
                except OSError:  # BrokenPipeError, ConnectionResetError: the peer closed the connection
                    state["peer_closed"] = True
                state["done"] = True
                self._close()

            def _read_chunked(self) -> bytes:
                out = b""
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()

            def _raw(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _answer(self, status: int, doc: dict | list, headers: dict | None = None) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Set-Cookie", "upstream-session=never-recorded")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _close(self) -> None:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                self.connection.close()

        self.server = ThreadingHTTPServer((self.host, self._port), Handler)
        self.server.daemon_threads = True
        if self.tls:
            assert self.certdir is not None
            cert, key = make_self_signed_cert(self.certdir)
            self.cert_path = cert
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()


# Headers of read faults answered by status: a 429 says when to ask again (longer than a test's backoff).
READ_RETRY_AFTER = {"429": {"Retry-After": "2"}}


class DecodingUpstream(Upstream):
    """
    An upstream that decodes a request body's Content-Encoding (gzip, deflate, br, zstd, stacked) before
    it reads it, as web frameworks with a decompression middleware do: the same JSON sent plain,
    gzip-encoded or deflated creates the same item. Written apart from proxy_addon/wire/bodies.py.
    """

    def content(self, encoding: str | None, body: bytes) -> bytes:
        import gzip
        import zlib

        import brotli

        if sys.version_info >= (3, 14):
            from compression import zstd
        else:
            from backports import zstd

        for coding in reversed([c.strip().lower() for c in (encoding or "").split(",") if c.strip()]):
            if coding in ("gzip", "x-gzip"):
                body = gzip.decompress(body)
            elif coding == "deflate":
                body = zlib.decompress(body)
            elif coding == "br":
                body = brotli.decompress(body)
            elif coding == "zstd":
                body = zstd.decompress(body)
        return body


class NginxUpstream(Upstream):
    """
    An upstream that routes like nginx in front of an app (`merge_slashes on`, its default):
    percent-encoded unreserved characters decoded, runs of '/' merged, '.' and '..' resolved,
    so that every spelling of a path reaches the same handler and counts as that path. With
    `fold_case`, letter case is ignored too, as IIS and some frameworks do. Written apart from
    proxy_addon/wire/canonical.py on purpose: the tests hold the proxy to what a server does.
    """

    def __init__(self, *, fold_case: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.fold_case = fold_case

    def route(self, target: str) -> str:
        import posixpath
        import re
        import string

        unreserved = string.ascii_letters + string.digits + "-._~"
        path = target.split("?")[0]
        path = re.sub(
            r"%([0-9A-Fa-f]{2})",
            lambda m: chr(int(m[1], 16)) if chr(int(m[1], 16)) in unreserved else m[0].upper(),
            path,
        )
        path = posixpath.normpath(re.sub(r"/+", "/", path) or "/")
        return path.lower() if self.fold_case else path


class ServletUpstream(Upstream):
    """
    An upstream that routes like a Servlet container (Tomcat's CoyoteAdapter, Jetty; Spring MVC on
    them): every segment's path parameters (from a ';' to the next '/': `;jsessionid=1`) are removed
    before routing, then dot segments are resolved, so `/api/b/things;jsessionid=1` and
    `/api/b/x/..;/things` are `/api/b/things`. A percent-encoded `%3B` is no separator there.
    Written apart from proxy_addon/wire/canonical.py on purpose.
    """

    def route(self, target: str) -> str:
        import posixpath
        import re

        path = re.sub(r";[^/]*", "", target.split("?")[0])
        return posixpath.normpath(path) if path.startswith("/") else path


class FlaskUpstream:
    """
    A real Flask app served by Werkzeug's own server on 127.0.0.1 (threaded), stopped on exit:

        POST /api/<bucket>/things   creates {"id": n, "title": ...} and answers it, 201
        GET  /api/<bucket>/things   the bucket's objects

    `created(bucket)` counts what the POSTs made; `targets` lists each request target as it
    arrived. Werkzeug reads the target with urlsplit, so a fragment sent in it (`things#x`) is
    dropped and the request is routed as `/api/<bucket>/things`, as issue 24 saw.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, list[dict]] = defaultdict(list)
        self.targets: list[str] = []
        self.server: BaseWSGIServer | None = None

    def created(self, bucket: str) -> int:
        with self.lock:
            return len(self.objects[bucket])

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FlaskUpstream:
        from flask import Flask, request
        from werkzeug.serving import make_server

        app = Flask("receipts-test-flask")
        up = self

        @app.before_request
        def seen():
            with up.lock:
                up.targets.append(request.environ.get("REQUEST_URI") or request.full_path)

        @app.post("/api/<bucket>/things")
        def create(bucket: str):
            doc = request.get_json(silent=True) or {}
            with up.lock:
                made = {"id": len(up.objects[bucket]) + 1, "title": doc.get("title")}
                up.objects[bucket].append(made)
            return made, 201

        @app.get("/api/<bucket>/things")
        def listing(bucket: str):
            with up.lock:
                return list(up.objects[bucket])

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class OverrideUpstream(Upstream):
    """
    An upstream that honours method override headers as web frameworks do: Rack's MethodOverride
    (Rails, Sinatra) and Express's method-override read X-HTTP-Method-Override, Microsoft's and
    some Java frameworks X-HTTP-Method, others X-Method-Override; the first of them present (in
    that order) names the method, in any letter case, if it is one Rack knows. Rack and Express
    honour them on a POST by default, Express on any method with `methods: null`, and so does this
    upstream: a GET naming POST is handled, and committed, as a POST. `up.overrides` lists each
    (method sent, method handled as, path). Written apart from proxy_addon/wire/canonical.py.
    """

    HEADERS = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")
    KNOWN = ("GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "LINK", "UNLINK")  # Rack::HTTP_METHODS

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.overrides: list[tuple[str, str, str]] = []

    def method_of(self, handler: BaseHTTPRequestHandler) -> str:
        sent = handler.command
        value = next((handler.headers[h] for h in self.HEADERS if handler.headers.get(h)), "")
        method = value.strip().upper()
        if method not in self.KNOWN:
            return sent
        if method in ("GET", "HEAD") and sent not in ("GET", "HEAD"):  # a read: its body is read and dropped here
            handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        with self.lock:
            self.overrides.append((sent, method, self.route(handler.path)))
        return method


# Read answers that are 200 but cannot be judged (plan_read(path, "deepjson"), ...).
UNJUDGEABLE = {
    "deepjson": b"[" * 100_000 + b"]" * 100_000,  # json.loads raises RecursionError
    "badutf8": b'[{"title": "\xff\xfe"}]',
    "notjson": b"<html>not json</html>",
}


def _paged(target: str, items: list[dict], base: str) -> tuple[dict | list, dict] | None:
    """
    A list read that asks for pages: `?limit=N[&starting_after=<id>]` answers Stripe's way, newest
    first: {"object": "list", "data": [...], "has_more": bool}; `?per_page=N[&page=k]` answers
    GitHub's way, newest first too: a plain list and `Link: <...&page=k+1>; rel="next"` while more
    follow. None: the read asks for no page (the whole list, as before).
    """
    from urllib.parse import parse_qs, urlencode, urlsplit

    split = urlsplit(target)
    q = {k: v[0] for k, v in parse_qs(split.query).items()}
    if "limit" in q:
        newest = list(reversed(items))
        after = q.get("starting_after")
        if after is not None:
            at = next((i for i, x in enumerate(newest) if str(x["id"]) == after), None)
            newest = newest[at + 1 :] if at is not None else []
        n = int(q["limit"])
        return {"object": "list", "data": newest[:n], "has_more": len(newest) > n}, {}
    if "per_page" in q:
        n, k = int(q["per_page"]), int(q.get("page", "1"))
        headers = {}
        if len(items) > n * k:
            headers["Link"] = f'<{base}{split.path}?{urlencode({**q, "page": k + 1})}>; rel="next"'
        return list(reversed(items))[n * (k - 1) : n * k], headers
    return None


def _query_fault(path: str) -> str:
    """`?fault=drop` picks the fault by hand (for trying the proxy with curl)."""
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(path).query).get("fault", ["ok"])[0]


def make_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, 127.0.0.2 and localhost, written as PEM files in `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "upstream-cert.pem", directory / "upstream-key.pem"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.2")),
                    x509.DNSName("localhost"),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class _Counted:
    """A connection's input that adds every byte read from it to `up.received`."""

    def __init__(self, raw, up: Upstream):
        self.raw, self.up = raw, up

    def _count(self, data: bytes) -> bytes:
        with self.up.lock:
            self.up.received += len(data)
        return data

    def read(self, *args) -> bytes:
        return self._count(self.raw.read(*args))

    def readline(self, *args) -> bytes:
        return self._count(self.raw.readline(*args))

    def __getattr__(self, name):
        return getattr(self.raw, name)


def free_port() -> int:
    """
    A loopback port nothing listens on, that no other process will be handed for a minute.

    Servers should not use this: Upstream and the test proxies bind port 0 and report the port
    they got (tests/conftest.py: Proxy, ScriptsRun). It is for the few ports that must be known
    before anything listens: a port that refuses connections ("connection refused" faults, then
    possibly an Upstream(port=...) there), mitmweb's web port (which cannot be 0; ScriptsRun
    retries on another if mitmweb fails to bind it), and a next-hop mitmdump started by hand.

    Why that is safe: binding port 0, closing it and binding it again later is a race, since the
    kernel may hand the port to any other process's bind(("...", 0)) in between. So the port is
    not just closed: a connection to it is accepted and the accepted side closed first, which
    leaves the port in TIME_WAIT (60 s on Linux). Linux does not hand a port in TIME_WAIT to a
    bind to port 0 (18,000 such binds in a row never got it, where a plainly closed port came
    back within 7,000), while a server that binds it by number with SO_REUSEADDR gets it
    (ThreadingHTTPServer, asyncio and so mitmproxy, and tornado so mitmweb, all set it); and
    with no listener there, a connection to it is refused.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()  # the side that closes first keeps the TIME_WAIT: this port's side
    return port


if __name__ == "__main__":  # a test API to try the proxy by hand: python tests/upstream.py [PORT]
    import sys
    import time

    up = Upstream(port=int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    with up:
        print(
            f"test upstream at {up.url}: every write commits; add ?fault=drop (or hang, half, 400, 500) "
            "to misbehave after the commit",
            flush=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass

"""
A hand-made MCP endpoint on 127.0.0.1 that answers a tools/call with an event stream of a shape
the official SDK's server cannot produce: many notifications before the result, a stream that
goes on after it, a result held until the test lets it go, a response with another id. A
tools/call is counted as a commit, then answered 200 `text/event-stream` with a chunked body,
events framed as the SDK's server frames them (`event: message\\r\\ndata: <JSON>\\r\\n\\r\\n`).
The tests drive it with a raw client (no session), or with the official SDK's client in the
2025-11-25 revision, for which it answers just enough of the rest: `initialize` (JSON, with an
Mcp-Session-Id; the tools capability), notifications and responses 202, `tools/list` (JSON:
create_issue, no output schema), GET 405 (no standalone stream), DELETE 200.

    with SseUpstream() as up:
        up.url                               # http://127.0.0.1:PORT/mcp
        up.created                           # tools/call commits
        up.release(title); up.peer_closed[title].wait(10)

The shape is the call's `shape` argument:
    flood    `n` notifications/progress (each padded to about `size` bytes), then the result
    endless  the result, then a `: ping` comment every 0.05 s until the peer closes the connection
             (then `peer_closed[title]` is set), ENDLESS_SECONDS pass or the upstream stops
    broken   the result, a `: ping`, then half an event and the connection cut (no last chunk)
    held     one notifications/message, then the result once `release(title)` is called, or after
             HOLD_SECONDS without it; the result's structuredContent says which (`released`)
    other    a response (a result) with another id (the request's id as a string, "7" for 7: JSON-RPC
             ids of two types are two ids), then, once `release(title)` is called (or after
             HOLD_SECONDS), the result; with `"then": "end"`, the stream ends after the other
             response, without the call's
    (none)   the result alone
The result: {"content": [{"type": "text", "text": <JSON>}], "structuredContent": {"number": n,
"title": ..., "released"?: bool}, "isError": false} under the request's id; `number` counts commits.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENDLESS_SECONDS = 60.0
HOLD_SECONDS = 10.0
BATCH = 64 * 1024  # bytes of events written at once


def event(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + json.dumps(message, separators=(",", ":")).encode() + b"\r\n\r\n"


class SseUpstream:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created = 0
        self.calls: list[dict[str, Any]] = []
        self.releases: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.peer_closed: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.pings: defaultdict[str, int] = defaultdict(int)  # pings written after an endless result
        self.stopping = threading.Event()  # ends the endless streams and the held results
        self.server: ThreadingHTTPServer | None = None

    def release(self, title: str) -> None:
        with self.lock:
            self.releases[title].set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def __enter__(self) -> SseUpstream:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                msg = json.loads(body)
                if msg.get("method") != "tools/call":
                    self.session(msg)
                    return
                args = msg["params"].get("arguments") or {}
                title = str(args.get("title"))
                with upstream.lock:
                    upstream.created += 1
                    number = upstream.created
                    upstream.calls.append(msg)
                    release = upstream.releases[title]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                structured: dict[str, Any] = {"number": number, "title": title}
                try:
                    shape = args.get("shape")
                    if shape == "flood":
                        self.flood(int(args["n"]), int(args.get("size", 200)))
                    elif shape == "other":
                        other = str(msg["id"]) if isinstance(msg["id"], int) else f"{msg['id']}-other"
                        self.chunk(
                            event(
                                {
                                    "jsonrpc": "2.0",
                                    "id": other,
                                    "result": {
                                        "content": [{"type": "text", "text": "an answer to another request"}],
                                        "isError": False,
                                    },
                                }
                            )
                        )
                        if args.get("then") == "end":
                            self.wfile.write(b"0\r\n\r\n")
                            self.wfile.flush()
                            return
                        ends = time.monotonic() + HOLD_SECONDS
                        while not release.is_set() and not upstream.stopping.is_set() and time.monotonic() < ends:
                            release.wait(0.05)
                        structured["released"] = release.is_set()
                    elif shape == "held":
                        self.chunk(
                            event(
                                {
                                    "jsonrpc": "2.0",
                                    "method": "notifications/message",
                                    "params": {"level": "info", "data": "working on it"},
                                }
                            )
                        )
                        ends = time.monotonic() + HOLD_SECONDS
                        while not release.is_set() and not upstream.stopping.is_set() and time.monotonic() < ends:
                            release.wait(0.05)
                        structured["released"] = release.is_set()
                    self.chunk(
                        event(
                            {
                                "jsonrpc": "2.0",
                                "id": msg["id"],
                                "result": {
                                    "content": [{"type": "text", "text": json.dumps(structured)}],
                                    "structuredContent": structured,
                                    "isError": False,
                                },
                            }
                        )
                    )
                    if shape == "broken":  # half an event, then the connection is cut: no last chunk
                        self.chunk(b": ping\r\n\r\n")
                        self.wfile.write(b"40\r\nevent: message\r\ndata: {")
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    if shape == "endless":
                        ends = time.monotonic() + ENDLESS_SECONDS
                        while time.monotonic() < ends and not upstream.stopping.is_set():
                            time.sleep(0.05)
                            self.chunk(b": ping\r\n\r\n")
                            with upstream.lock:
                                upstream.pings[title] += 1
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:  # the peer closed the connection
                    upstream.peer_closed[title].set()
                    self.close_connection = True

            def session(self, msg: dict[str, Any]) -> None:
                """What the SDK's client sends besides tool calls, answered just enough (module docstring)."""
                method, extra = msg.get("method"), {}
                if method == "initialize":
                    extra = {"Mcp-Session-Id": "sse-upstream-session"}
                    result: dict[str, Any] = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "sse-upstream", "version": "1"},
                    }
                elif method == "tools/list":
                    result = {"tools": [{"name": "create_issue", "inputSchema": {"type": "object"}}]}
                elif method is None or "id" not in msg:  # a notification, or a response: accepted
                    self.send_response(202)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                else:
                    self.send_error(404)
                    return
                data = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
                self.send_response(200)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **extra}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.send_error(405)

            def do_DELETE(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def flood(self, n: int, size: int) -> None:
                pad = "x" * max(0, size - 120)
                batch = bytearray()
                for i in range(n):
                    batch += event(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": i, "total": n, "message": pad},
                        }
                    )
                    if len(batch) >= BATCH:
                        self.chunk(bytes(batch))
                        batch.clear()
                if batch:
                    self.chunk(bytes(batch))

            def chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

"""
A hand-made MCP endpoint on 127.0.0.1 that answers a tools/call with the JSON-RPC error a test
asks for, framed as JSON or as an event stream, under the HTTP status it names: the errors the
SDK's server does not raise on demand (-32700 for a body the proxy lets through, -32601 for a
tool call) and the framings it does not give them (the SDK's 2026-07-28 server answers every
error raised before the tool with 400 and a JSON body). Only tools/call is served.

    with ErrorUpstream() as up:
        up.url                                        # http://127.0.0.1:PORT/mcp
        up.answer(-32020, framing="sse", status=200)  # the next tools/call gets this error
        up.requests(title)                            # tools/call POSTs of that title that came
        up.effects(title)                             # ...and that ran the tool (its commits)

Answers queued with `answer` are given to the next tools/calls, one each, in order. Without one,
the tool runs: one effect, answered 200 `application/json` with the result
{"content": [text], "structuredContent": {"number": n, "title": ...}, "isError": false} and
`"resultType": "complete"` (read by clients of both revisions).
An answer:
    code     the error's code; its message is "<code> from the test upstream"
    framing  "json" (`application/json`, the message alone) or "sse" (`text/event-stream`, one
             `message` event)
    status   the HTTP status (200 by default)
    with_id  True (default): under the request's id; False: `"id": null`, as JSON-RPC answers a
             request whose id it could not read (a parse error, an invalid request)
    commit   True: the tool runs first (an effect), then the error (an internal error after it)
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ErrorUpstream:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued: list[dict[str, Any]] = []
        self.seen: Counter[str] = Counter()  # tools/call POSTs, by title
        self.ran: Counter[str] = Counter()  # effects, by title
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def answer(
        self, code: int, *, framing: str = "json", status: int = 200, with_id: bool = True, commit: bool = False
    ) -> None:
        assert framing in ("json", "sse"), framing
        with self.lock:
            self.queued.append(
                {"code": code, "framing": framing, "status": status, "with_id": with_id, "commit": commit}
            )

    def requests(self, title: str) -> int:
        with self.lock:
            return self.seen[title]

    def effects(self, title: str) -> int:
        with self.lock:
            return self.ran[title]

    def __enter__(self) -> ErrorUpstream:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                msg = json.loads(body)
                if msg.get("method") != "tools/call":
                    self.send_error(404)
                    return
                title = str((msg["params"].get("arguments") or {}).get("title"))
                with upstream.lock:
                    upstream.seen[title] += 1
                    planned = upstream.queued.pop(0) if upstream.queued else None
                    if planned is None or planned["commit"]:
                        upstream.ran[title] += 1
                    number = sum(upstream.ran.values())
                if planned is None:
                    structured = {"number": number, "title": title}
                    self.send(
                        200,
                        "json",
                        {
                            "jsonrpc": "2.0",
                            "id": msg["id"],
                            "result": {
                                "content": [{"type": "text", "text": json.dumps(structured)}],
                                "structuredContent": structured,
                                "isError": False,
                                "resultType": "complete",
                            },
                        },
                    )
                    return
                error = {"code": planned["code"], "message": f"{planned['code']} from the test upstream"}
                rid = msg["id"] if planned["with_id"] else None
                self.send(planned["status"], planned["framing"], {"jsonrpc": "2.0", "id": rid, "error": error})

            def send(self, status: int, framing: str, message: dict[str, Any]) -> None:
                data = json.dumps(message, separators=(",", ":")).encode()
                if framing == "sse":
                    data, ctype = b"event: message\r\ndata: " + data + b"\r\n\r\n", "text/event-stream"
                else:
                    ctype = "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()

"""
A minimal, fast HTTP/1.1 upstream for the benchmark (asyncio, keep-alive, loopback only).

    python -m bench.upstream            # prints "bench-upstream: listening on 127.0.0.1:PORT"

- POST/PUT/PATCH/DELETE: 201 `{"id": n}` (n counts writes); GET/HEAD: 200 `{"ok": true}`.
- `?fault=drop` in the target: close the connection without answering (the write's
  outcome is then unknown to whoever sent it).
- `GET /__stats`: what it has seen, as JSON: requests per `X-Bench-Path` header value,
  and how many requests carried an `Expect` header.

Each response leaves in one send() on a TCP_NODELAY socket (asyncio sets it), so the
upstream itself never adds a Nagle/delayed-ACK stall to what is measured.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter

STATS: Counter[str] = Counter()
WRITES = 0


def _response(status: int, reason: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Http(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        global WRITES
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            try:
                method, target, _ = lines[0].split(" ", 2)
            except ValueError:
                self.transport.close()
                return
            length, close, tag, expect = 0, False, "", False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection":
                    close = value.strip().lower() == "close"
                elif name == "x-bench-path":
                    tag = value.strip()
                elif name == "expect":
                    expect = True
                elif name == "transfer-encoding":  # the bench's clients never send chunked bodies
                    self.transport.write(_response(411, "Length Required", b'{"error": "chunked"}'))
                    self.transport.close()
                    return
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            STATS[f"path:{tag}"] += 1
            STATS["expect"] += expect
            if "fault=drop" in target:
                STATS["dropped"] += 1
                self.transport.close()
                return
            if method in ("GET", "HEAD"):
                body = json.dumps(dict(STATS)).encode() if target.startswith("/__stats") else b'{"ok": true}'
                out = _response(200, "OK", body)
            else:
                WRITES += 1
                out = _response(201, "Created", b'{"id": %d}' % WRITES)
            self.transport.write(out)
            if close:
                self.transport.close()
                return


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Http, "127.0.0.1", port, backlog=1024)
    print(f"bench-upstream: listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))

"""The approval links' endpoint (mitm/approval_server.py): it never holds more than SLOTS requests at once."""

from __future__ import annotations

import socket
import threading
import types
from typing import Any, cast

from proxy_addon.mitm import approval_server


def test_connections_past_the_slots_are_closed_and_the_slots_come_back(monkeypatch):
    monkeypatch.setattr(approval_server._Handler, "timeout", 300)  # an idle client keeps its thread that long
    server = approval_server._Server(("127.0.0.1", 0), cast(Any, types.SimpleNamespace(installation=None)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    at = ("127.0.0.1", server.server_address[1])
    idle = [socket.create_connection(at, timeout=60) for _ in range(approval_server.SLOTS)]
    try:
        for s in idle:  # each is taken by a thread that waits for its request line
            s.sendall(b"G")
        extra = socket.create_connection(at, timeout=30)  # without a bound: a 17th thread, and no answer in 30 s
        assert extra.recv(100) == b""  # closed unanswered: before, one more thread (without bound)
        extra.close()
        for s in idle:
            s.close()
        answer = b""
        for _ in range(200):  # the slots come back as their threads see the closed connections
            with socket.create_connection(at, timeout=60) as s:
                s.sendall(b"GET /approvals/x HTTP/1.0\r\n\r\n")
                answer = s.recv(100)
            if answer:
                break
        assert answer.startswith(b"HTTP/1.0 404")
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()

"""
No raw control characters reach a terminal: an upstream's reason phrase, through a real proxy, reaches
neither its log nor the CLI raw (the escaping itself: tests/wire/test_terminal.py).
"""

from __future__ import annotations

import socket
import threading

import pytest

from proxy_addon.cli import main
from proxy_addon.store import Store
from tests.conftest import wait_for
from tests.e2e.processes import Proxy


@pytest.fixture
def rude_upstream():
    """An upstream whose reason phrase holds escape sequences; one request per connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 400 Bad \x1b[2J\x1b[31mRequest\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                )

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


def test_an_upstream_reason_phrase_reaches_neither_log_nor_cli_raw(tmp_path, confdir, rude_upstream, capsys):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_forward=mitmproxy")).start()
    try:
        import httpx

        with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as c:
            r = c.post(f"http://127.0.0.1:{rude_upstream}/api/esc/things", json={"title": "x"})
        assert r.status_code == 400
        store = Store.open(proxy.db, create=False)
        (receipt,) = [x for x in store.list() if "/api/esc/" in x.target]
        store.close()
        assert receipt.state == "rejected" and "\x1b[2J" in (receipt.error or "")  # recorded as it came
        wait_for(lambda: receipt.operation_id in proxy.log(), what="the log line")
        assert "\x1b" not in proxy.log()
        capsys.readouterr()
        main(["--db", str(proxy.db), "show", receipt.operation_id])
        out = capsys.readouterr().out
        assert "\x1b" not in out and "Bad \\x1b[2J\\x1b[31mRequest" in out
    finally:
        proxy.stop()

"""
No raw control characters reach a terminal: an upstream controls reason phrases, errors and
ids that receipts record; the CLI and the proxy's log show them escaped.
"""

from __future__ import annotations

import socket
import threading

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store
from proxy_addon.wire.terminal import escape_controls
from tests.conftest import Proxy, wait_for

RAW = "\x1b[2J\x1b[31mFAKE\x9b2J\x07\x00\x7f"


@pytest.mark.parametrize("text, shown", [
    ("plain text\nnext\tline", "plain text\nnext\tline"),
    ("\x1b[2J", "\\x1b[2J"),
    ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
    ("c1 csi \x9b2J nel \x85", "c1 csi \\x9b2J nel \\x85"),
    ("café ✓", "café ✓"),
    ("cr\rlf", "cr\\x0dlf"),
])
def test_escape_controls(text, shown):
    assert escape_controls(text) == shown


def test_receipts_show_and_list_print_no_raw_controls(tmp_path, capsys):
    db = tmp_path / "r.db"
    store = Store.open(db)
    d = store.begin_attempt(Attempt(api="a", operation="o", method="POST", target="http://x.test/y",
                                    intent_fingerprint="sha256:1", intent={"body": {"title": RAW}}, principal="p"))
    store.transition(d.receipt.operation_id, State.SUCCEEDED, reason=f"upstream answered HTTP 201 {RAW}",
                     http_status=201, external_id=RAW, error=None,
                     response=RecordedResponse(201, [], b"{}"))
    store.close()
    capsys.readouterr()
    for argv in (["show", d.receipt.operation_id], ["list"], ["blocked"], ["export"], ["show", "nope"]):
        main(["--db", str(db), *argv])
        out, err = capsys.readouterr()
        for text in (out, err):
            assert not any(c in text for c in "\x1b\x9b\x07\x00\x7f"), (argv, text)
    main(["--db", str(db), "show", d.receipt.operation_id])
    assert "\\x1b[2J\\x1b[31mFAKE\\x9b2J" in capsys.readouterr().out


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
                conn.sendall(b"HTTP/1.1 400 Bad \x1b[2J\x1b[31mRequest\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\n{}")

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


def test_the_proxys_log_lines_escape_controls(caplog):
    import logging

    from proxy_addon.gate import admission as gate  # a module that logs an upstream's text (targets, reasons)
    from proxy_addon.wire.terminal import escape_logs

    escape_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger(gate.__name__).warning("receipt x: %s", RAW)
    assert caplog.messages == ["receipt x: \\x1b[2J\\x1b[31mFAKE\\x9b2J\\x07\\x00\\x7f"]

"""
No raw control characters reach a terminal (wire/terminal.py): an upstream controls reason phrases,
errors and ids that receipts record; the CLI and the proxy's log lines show them escaped. An upstream's
reason phrase through a real proxy: tests/e2e/proxy/test_terminal.py.
"""

from __future__ import annotations

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store
from proxy_addon.wire.terminal import escape_controls

RAW = "\x1b[2J\x1b[31mFAKE\x9b2J\x07\x00\x7f"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("plain text\nnext\tline", "plain text\nnext\tline"),
        ("\x1b[2J", "\\x1b[2J"),
        ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
        ("c1 csi \x9b2J nel \x85", "c1 csi \\x9b2J nel \\x85"),
        ("café ✓", "café ✓"),
        ("cr\rlf", "cr\\x0dlf"),
    ],
)
def test_escape_controls(text, shown):
    assert escape_controls(text) == shown


def test_receipts_show_and_list_print_no_raw_controls(tmp_path, capsys):
    db = tmp_path / "r.db"
    store = Store.open(db)
    d = store.begin_attempt(
        Attempt(
            api="a",
            operation="o",
            method="POST",
            target="http://x.test/y",
            intent_fingerprint="sha256:1",
            intent={"body": {"title": RAW}},
            principal="p",
        )
    )
    store.transition(
        d.receipt.operation_id,
        State.SUCCEEDED,
        reason=f"upstream answered HTTP 201 {RAW}",
        http_status=201,
        external_id=RAW,
        error=None,
        response=RecordedResponse(201, [], b"{}"),
    )
    store.close()
    capsys.readouterr()
    for argv in (["show", d.receipt.operation_id], ["list"], ["blocked"], ["export"], ["show", "nope"]):
        main(["--db", str(db), *argv])
        out, err = capsys.readouterr()
        for text in (out, err):
            assert not any(c in text for c in "\x1b\x9b\x07\x00\x7f"), (argv, text)
    main(["--db", str(db), "show", d.receipt.operation_id])
    assert "\\x1b[2J\\x1b[31mFAKE\\x9b2J" in capsys.readouterr().out


def test_the_proxys_log_lines_escape_controls(caplog):
    import logging

    from proxy_addon.gate import admission as gate  # a module that logs an upstream's text (targets, reasons)
    from proxy_addon.wire.terminal import escape_logs

    escape_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger(gate.__name__).warning("receipt x: %s", RAW)
    assert caplog.messages == ["receipt x: \\x1b[2J\\x1b[31mFAKE\\x9b2J\\x07\\x00\\x7f"]

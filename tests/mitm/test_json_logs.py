"""mitm/json_logs.py: the addon's lines as one JSON object each, mitmproxy's own untouched."""

from __future__ import annotations

import json
import logging

import pytest

from proxy_addon.mitm import json_logs


def record(name: str, msg: str, *args, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, exc_info)


class Plain(logging.Formatter):
    def format(self, record):
        return "PLAIN " + record.getMessage()


def test_an_addon_line_is_one_json_object_with_its_writes_fields():
    f = json_logs.JsonLines(Plain(), None)
    meta = {"operation_id": "R1", "api": "a", "operation": "o.create", "state": "blocked", "reason": "why"}
    token = json_logs.current.set(meta)
    try:
        line = f.format(record("proxy_addon.mitm.receipts_addon", "receipt %s: duplicate blocked", "R1"))
    finally:
        json_logs.current.reset(token)
    doc = json.loads(line)
    assert doc["event"] == "receipt R1: duplicate blocked" and doc["level"] == "warning"
    assert {k: doc[k] for k in ("receipt", "api", "operation", "state", "reason")} == {
        "receipt": "R1",
        "api": "a",
        "operation": "o.create",
        "state": "blocked",
        "reason": "why",
    }
    assert doc["time"].endswith("+00:00") and "trace_id" not in doc


def test_outside_a_write_the_receipt_comes_from_the_text():
    doc = json.loads(
        json_logs.JsonLines(None, None).format(record("proxy_addon.gate.admission", "receipt 20260101T000000Z-abc: x"))
    )
    assert doc["receipt"] == "20260101T000000Z-abc" and "api" not in doc


def test_a_state_being_recorded_is_the_outcome():
    token = json_logs.current.set({"operation_id": "R1", "state": "submitted", "outcome": "outcome_unknown"})
    try:
        doc = json.loads(json_logs.JsonLines(None, None).format(record("proxy_addon.x", "receipt R1: y")))
    finally:
        json_logs.current.reset(token)
    assert doc["state"] == "outcome_unknown"


def test_a_traceback_stays_on_the_one_line():
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        import sys

        line = json_logs.JsonLines(None, None).format(record("proxy_addon.x", "failed", exc_info=sys.exc_info()))
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_mitmproxys_own_lines_keep_their_format():
    assert (
        json_logs.JsonLines(Plain(), None).format(record("mitmproxy.proxy", "client connect")) == "PLAIN client connect"
    )


@pytest.fixture
def handler():
    h = logging.StreamHandler()
    h.setFormatter(Plain())
    logging.getLogger().addHandler(h)
    yield h
    logging.getLogger().removeHandler(h)


def test_configure_puts_it_on_and_takes_it_off(handler):
    json_logs.configure("json", None)
    assert isinstance(handler.formatter, json_logs.JsonLines)
    json_logs.configure("json", None)  # again: not wrapped twice
    assert isinstance(handler.formatter.fallback, Plain)
    json_logs.configure("text", None)
    assert isinstance(handler.formatter, Plain)

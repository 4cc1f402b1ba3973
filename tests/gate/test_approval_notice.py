"""The approval webhook's body and its signature (gate/approval_notice.py)."""

from __future__ import annotations

import datetime as dt
import json

from proxy_addon.gate.approval_notice import (
    SIGNATURE,
    TIMESTAMP,
    notice_body,
    signature,
    signed_headers,
    verify_signature,
)
from proxy_addon.states import State
from proxy_addon.store import Receipt

RECEIPT = Receipt(
    operation_id="20261129T190502Z-7c1e02d9aa",
    api="stripe",
    operation="refunds.create",
    method="POST",
    target="https://api.stripe.com/v1/refunds",
    state=State.AWAITING_APPROVAL,
    intent_fingerprint="sha256:" + "ab" * 32,
    intent={"body": {"amount": 250000, "reason": "<b>&"}},
    principal="p",
    submitted_at="2026-11-29T19:05:02.113201Z",
    updated_at="2026-11-29T19:05:02.113201Z",
    completed_at=None,
    http_status=None,
    error=None,
    external_id=None,
    flow_id=None,
    retry_of=None,
    instance=None,
)
EXPIRES = dt.datetime(2026, 11, 29, 19, 10, 2, tzinfo=dt.UTC)
LINKS = {"approve": "http://127.0.0.1:9465/approvals/a.1", "deny": "http://127.0.0.1:9465/approvals/d.2"}


def test_the_body_carries_the_receipt_the_intent_the_links_and_a_slack_text():
    doc = json.loads(notice_body(RECEIPT, expires_at=EXPIRES, rules_version="p1:0123", links=LINKS))
    assert doc["receipt"] == {
        "id": RECEIPT.operation_id,
        "api": "stripe",
        "operation": "refunds.create",
        "method": "POST",
        "target": "https://api.stripe.com/v1/refunds",
        "state": "awaiting_approval",
        "submitted_at": "2026-11-29T19:05:02.113201Z",
        "expires_at": "2026-11-29T19:10:02.000000Z",
        "fingerprint": RECEIPT.intent_fingerprint,
        "rules_version": "p1:0123",
    }
    assert doc["intent"] == RECEIPT.intent and doc["links"] == LINKS and doc["event"] == "approval_requested"
    text = doc["text"]
    assert f"<{LINKS['approve']}|Approve> · <{LINKS['deny']}|Deny>" in text
    assert "&lt;b&gt;&amp;" in text and "<b>" not in text  # the intent cannot make Slack links or markup


def test_without_links_the_text_says_how_to_decide():
    doc = json.loads(notice_body(RECEIPT, expires_at=EXPIRES, rules_version="p1:0123", links=None))
    assert doc["links"] is None and f"receipts approve {RECEIPT.operation_id}" in doc["text"]


def test_the_signature_covers_the_timestamp_and_the_exact_body():
    body = notice_body(RECEIPT, expires_at=EXPIRES, rules_version="p1:0123", links=LINKS)
    h = signed_headers(body, b"secret", at=1_900_000_000)
    assert h[TIMESTAMP] == "1900000000" and h[SIGNATURE].startswith("sha256=") and len(h[SIGNATURE]) == 71
    ok = dict(now=1_900_000_010, tolerance=300)
    assert verify_signature(body, h[TIMESTAMP], h[SIGNATURE], b"secret", **ok)
    assert not verify_signature(body, h[TIMESTAMP], h[SIGNATURE], b"other", **ok)
    assert not verify_signature(body + b" ", h[TIMESTAMP], h[SIGNATURE], b"secret", **ok)
    assert not verify_signature(body, "1900000001", h[SIGNATURE], b"secret", **ok)  # another time: another MAC
    assert not verify_signature(body, h[TIMESTAMP], h[SIGNATURE], b"secret", now=1_900_000_301, tolerance=300)
    assert not verify_signature(body, "soon", h[SIGNATURE], b"secret", **ok)
    assert signature(body, b"secret", 1) != signature(body, b"secret", 2)

"""
What the approval webhook receives when a write is held (receipts_approval_webhook): the
JSON body, and the headers that sign it.

    body = notice_body(receipt, expires_at=..., rules_version=..., links={"approve": url, "deny": url})
    headers = signed_headers(body, secret, at=int(time.time()))

The body carries the receipt (id, api, operation, method, target, state, submitted_at,
expires_at, fingerprint, rules_version), the intent's named fields as the receipt records them
(the fingerprint's allowlisted, redacted view: never a credential), the approve and deny links
(null when the proxy has no link endpoint), and a `text` in Slack's mrkdwn, so that a Slack
incoming-webhook URL works as it is.

The signature is HMAC-SHA256, keyed with the webhook secret, over `<timestamp>.<body>`: the
exact bytes of the body, after the decimal Unix timestamp sent in X-Receipt-Timestamp and a dot.
X-Receipt-Signature is `sha256=<64 hex digits>`. A receiver recomputes it over the bytes it got,
compares in constant time, and refuses a timestamp too far from its clock (a replay).
docs/operations.md shows a receiver's check.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

from proxy_addon.store import Receipt, iso

SIGNATURE = "X-Receipt-Signature"
TIMESTAMP = "X-Receipt-Timestamp"
EVENT = "approval_requested"
TEXT_INTENT = 600  # characters of the intent the Slack text shows (the JSON field has all of it)


def _slack(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally: &, < and > escaped (its three control characters)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def notice_text(receipt: Receipt, expires_at: str, links: dict[str, str] | None) -> str:
    intent = json.dumps(receipt.intent, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(intent) > TEXT_INTENT:
        intent = intent[:TEXT_INTENT] + "…"
    lines = [
        f"*A write awaits approval*: {_slack(receipt.api)} {_slack(receipt.operation)}",
        f"`{_slack(receipt.method)} {_slack(receipt.target)}`",
        f"intent: `{_slack(intent)}`",
        f"receipt {receipt.operation_id}; denied unless decided before {expires_at}",
    ]
    if links:
        lines.append(f"<{links['approve']}|Approve> · <{links['deny']}|Deny>")
    else:
        lines.append(f"decide with: receipts approve {receipt.operation_id} (or receipts deny, or mitmweb)")
    return "\n".join(lines)


def notice(
    receipt: Receipt, *, expires_at: datetime, rules_version: str, links: dict[str, str] | None
) -> dict[str, Any]:
    """The webhook's JSON document for a held write."""
    expires = iso(expires_at)
    return {
        "event": EVENT,
        "receipt": {
            "id": receipt.operation_id,
            "api": receipt.api,
            "operation": receipt.operation,
            "method": receipt.method,
            "target": receipt.target,
            "state": str(receipt.state),
            "submitted_at": receipt.submitted_at,
            "expires_at": expires,
            "fingerprint": receipt.intent_fingerprint,
            "rules_version": rules_version,
        },
        "intent": receipt.intent,
        "links": links,
        "text": notice_text(receipt, expires, links),
    }


def notice_body(receipt: Receipt, *, expires_at: datetime, rules_version: str, links: dict[str, str] | None) -> bytes:
    """The exact bytes POSTed (and signed)."""
    doc = notice(receipt, expires_at=expires_at, rules_version=rules_version, links=links)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def signature(body: bytes, secret: bytes, at: int) -> str:
    """`sha256=<hex>`: HMAC-SHA256 of `<at>.<body>` under the webhook secret."""
    return "sha256=" + hmac.new(secret, str(at).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def signed_headers(body: bytes, secret: bytes, at: int) -> dict[str, str]:
    """The headers of the POST: its type, the timestamp and the signature."""
    return {"Content-Type": "application/json", TIMESTAMP: str(at), SIGNATURE: signature(body, secret, at)}


def verify_signature(body: bytes, timestamp: str, given: str, secret: bytes, *, now: float, tolerance: float) -> bool:
    """A receiver's check (what docs/operations.md shows): the signature matches, and the timestamp is recent."""
    if not timestamp.isdigit() or abs(now - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(signature(body, secret, int(timestamp)), given)

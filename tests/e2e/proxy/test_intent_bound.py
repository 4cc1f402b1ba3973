"""
The stored intent's size bound through a real proxy: a large field is stored bounded (as a keyed hash)
and the duplicate is still replayed. The bound itself (intent/body_view.py `bound_intent`):
tests/intent/test_body_view_bound.py.
"""

from __future__ import annotations

import json

from tests.e2e.proxy.test_integration import receipts_for


def test_a_large_field_through_the_proxy_is_stored_bounded_and_replayed(clients, upstream, bucket):
    """A real proxy: a 100 KB title under plain.create (no read) is stored as a hash; the retry is replayed."""
    path = f"/api/{bucket}/plain"
    title = "long " * 20_000
    first = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": title})
    again = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": title})
    assert first.status == 201 and again.headers.get("x-receipt-replayed") == "true", (first, again)
    assert upstream.commits(path) == 1
    [r] = receipts_for(clients.proxy, bucket)
    assert r.intent["body"]["title"].startswith("hmac:") and r.intent["bounded"] == ["intent.title"]
    assert len(json.dumps(r.intent)) < 1024

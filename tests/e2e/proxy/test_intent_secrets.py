"""
Names that are on no list (`?x_thing=`, a body key `nested.blob`) reach no DB, WAL or log, through a
real proxy (tests/conftest.py SECRETS sweeps every run too). What an intent stores, without a proxy:
tests/intent/test_fingerprint_secrets.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from proxy_addon.store import Store
from proxy_addon.wire.redaction import REDACTED
from tests.conftest import SECRETS, marker_secrets_in, read, wait_for
from tests.e2e.processes import Clients


def test_names_on_no_list_reach_no_db_wal_or_log(proxy, upstream, bucket):
    """`?x_thing=` and a body key `nested.blob` are on no list of secret names: redacted all the same."""
    clients = Clients(proxy)
    path = f"/api/{bucket}/objects"
    body = {"title": "objects", "nested": {"blob": SECRETS["blob"], "n": 1}}
    url = f"{upstream.url}{path}?page=7&x_thing={SECRETS['x_thing']}"
    first = clients.send("requests", "POST", url, body)
    assert first.status == 201, first
    assert upstream.commits(path) == 1
    assert upstream.requests[-1]["body"] == json.dumps(body).encode()  # forwarded as sent: only storage redacts
    store = Store.open(proxy.db, create=False)
    try:
        (r,) = wait_for(lambda: [x for x in store.list(limit=None) if path in x.target and x.state == "succeeded"])
    finally:
        store.close()
    assert r.target == f"{upstream.url}{path}?page=7&x_thing={REDACTED}&token={REDACTED}&x_thing={REDACTED}"
    assert r.intent["body"]["nested"].startswith("hmac:") and r.intent["hashed"] == ["nested"]
    # A different object under the same name is a different write; the same one is a duplicate.
    other = clients.send("curl", "POST", url, {**body, "nested": {"blob": "other", "n": 1}})
    again = clients.send("httpx", "POST", url, body)
    assert (other.status, other.headers.get("x-receipt-replayed")) == (201, None)
    assert (again.status, again.headers.get("x-receipt-replayed")) == (201, "true")
    assert upstream.commits(path) == 2
    files = [proxy.db, Path(f"{proxy.db}-wal"), proxy.log_path]
    assert marker_secrets_in(files) == []
    assert SECRETS["x_thing"].encode() not in b"".join(read(p) for p in files)

"""
The store knows it is the same store: a receipts database removed or replaced under a running
proxy, or its WAL removed, fails closed (503, nothing forwarded); a restart does not quietly
create an empty database where one was. The upstream counts the writes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from proxy_addon.store import Store
from tests.conftest import wait_for
from tests.e2e.processes import Clients, Proxy
from tests.e2e.reconcile.test_reconcile import unknown_write


def unavailable(answer) -> bool:
    return answer.status == 503 and answer.json()["error"] == "receipt_store_unavailable" and not answer.json()["sent"]


def test_a_removed_database_fails_closed(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir).start()
    assert isinstance(proxy.db, Path)  # a SQLite file
    clients = Clients(proxy)
    try:
        unknown_write(clients, proxy, upstream, bucket, "plain", {"title": "a"}, "drop")
        for suffix in ("", "-wal", "-shm"):
            os.unlink(f"{proxy.db}{suffix}")
        before = upstream.commits(f"/api/{bucket}/plain")
        dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "a"})
        new = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "b"})
        assert unavailable(dup) and unavailable(new)
        assert upstream.commits(f"/api/{bucket}/plain") == before == 1  # no second write, no unrecorded one
        assert f"{proxy.db} was removed while this process had it open" in proxy.log()
    finally:
        proxy.stop()
    # A restart does not make an empty database beside the key: that would let both writes through.
    again = Proxy(tmp_path, confdir, db=proxy.db).start(wait=False)
    wait_for(lambda: again.process.poll() is not None, timeout=20, what="the proxy to refuse to start")
    assert again.process.returncode != 0
    assert f"{proxy.db} does not exist, but" in again.log() and "receipts_new_db=true" in again.log()
    assert not proxy.db.exists()
    fresh = Proxy(tmp_path, confdir, db=proxy.db, extra=("--set", "receipts_new_db=true")).start()
    fresh.stop()
    assert proxy.db.exists()


def test_a_replaced_database_fails_closed(tmp_path, confdir, upstream, bucket):
    other = tmp_path / "other"
    other.mkdir()
    Store.open(other / "receipts.db").close()  # a valid, empty receipts database
    proxy = Proxy(tmp_path, confdir).start()
    clients = Clients(proxy)
    try:
        unknown_write(clients, proxy, upstream, bucket, "plain", {"title": "a"}, "drop")
        os.replace(other / "receipts.db", proxy.db)
        dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "a"})
        assert unavailable(dup)
        assert upstream.commits(f"/api/{bucket}/plain") == 1
        assert "was replaced by another file while this process had it open" in proxy.log()
    finally:
        proxy.stop()


def test_a_removed_wal_fails_closed_and_loses_no_committed_receipt(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir).start()
    clients = Clients(proxy)
    try:
        first = unknown_write(clients, proxy, upstream, bucket, "plain", {"title": "a"}, "drop")
        saved = tmp_path / "wal-copy"
        shutil.copy(f"{proxy.db}-wal", saved)  # what a careless clean-up removes
        os.unlink(f"{proxy.db}-wal")
        dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "a"})
        assert unavailable(dup)
        assert upstream.commits(f"/api/{bucket}/plain") == 1
        assert f"{proxy.db}-wal was removed while this process had it open" in proxy.log()
    finally:
        proxy.stop()
    # The proxy kept the WAL open: stopping it checkpoints what it committed into the database.
    store = Store.open(proxy.db, create=False)
    try:
        assert store.get(first.operation_id).state == "outcome_unknown"
    finally:
        store.close()

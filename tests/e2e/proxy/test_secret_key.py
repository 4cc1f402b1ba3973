"""
A receipts database keeps a check value of its secret.key (store/key_check.py), on SQLite as on
PostgreSQL: a proxy started with the key lost, or with another one, refuses to start with one
line that names the files and what to do. With a new key every principal, so every fingerprint,
would change: an unresolved write's retry would be sent again, and a success not replayed.
The check itself: tests/gate/test_installation.py.
"""

from __future__ import annotations

import secrets

import pytest

from proxy_addon.errors import StoreError
from proxy_addon.gate.installation import Installation, key_check
from proxy_addon.store import open_store
from tests.conftest import wait_for
from tests.e2e.processes import Clients, Proxy

READY = "receipt-proxy: ready"


def started_or_exited(proxy: Proxy) -> bool:
    """Whether the proxy (started with wait=False) exited, or is ready; its log is its own."""
    assert proxy.proc is not None
    return proxy.proc.poll() is not None or READY in proxy.log()


@pytest.mark.parametrize("loss", ["deleted", "replaced"])
def test_a_lost_secret_key_stops_the_proxy_and_the_retry_is_never_sent(tmp_path, confdir, upstream, bucket, loss):
    path = f"/api/{bucket}/plain"  # plain.create: no reconcile read, an unknown outcome stays unresolved
    first = Proxy(tmp_path, confdir).start()
    try:
        upstream.plan(path, "500")
        answer = Clients(first).send("requests", "POST", f"{upstream.url}{path}", {"title": "once"})
        assert (answer.status, answer.headers.get("x-receipt-state")) == (500, "outcome_unknown")
    finally:
        first.stop()
    assert upstream.seen(path) == 1

    key = tmp_path / "secret.key"
    if loss == "deleted":
        key.unlink()
    else:
        key.write_text(secrets.token_hex(32) + "\n")  # another key, as a restore from the wrong backup
    again = Proxy(tmp_path, confdir).start(wait=False)  # the same state directory, a log of its own
    try:
        wait_for(lambda: started_or_exited(again), timeout=30, what="the proxy to start or exit")
        if again.process.poll() is None:  # it started (as it did before the key check): the retry goes through it
            again.ready()
            Clients(again).send("requests", "POST", f"{upstream.url}{path}", {"title": "once"})
        assert upstream.seen(path) == 1, "the retry of an unresolved write was sent again"
        again.process.wait(timeout=30)
        assert again.process.returncode != 0
    finally:
        again.stop()
    what = "is missing" if loss == "deleted" else "is not the one the receipts database"
    lines = [line for line in again.log().splitlines() if what in line]
    assert len(lines) == 1, again.log()
    line = lines[0]
    assert str(key) in line and str(tmp_path / "receipts.db") in line
    assert "unresolved writes would be sent again" in line
    assert "Restore" in line and "--set receipts_new_db=true" in line and "Starting over" in line
    assert READY not in again.log()
    assert key.exists() is (loss == "replaced")  # no new key was made beside receipts made with the old one


def test_a_fleet_proxy_without_the_key_is_refused_and_makes_none(pg_url, tmp_path):
    key = tmp_path / "fleet.key"
    first = Installation.open(pg_url, secret=str(key), lease=15, heartbeat=5)
    first.release()
    first.store.close()
    missing = tmp_path / "elsewhere" / "secret.key"
    with pytest.raises(StoreError, match=r"is missing, and the other proxies on .* use one"):
        Installation.open(pg_url, secret=str(missing))
    assert not missing.exists()
    store = open_store(pg_url, create=False)
    try:
        assert store.recorded_key_check() == key_check(key.read_bytes().strip())
    finally:
        store.close()

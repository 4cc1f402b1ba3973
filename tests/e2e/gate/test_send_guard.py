"""
Recovery on a real PostgreSQL reads which leases live only after the receipts in flight, so that a
lease renewed in between never lets another proxy recover a write still being sent. The send guard's
rules one by one: tests/gate/test_send_guard.py; the whole story with real proxies:
tests/e2e/store/test_fleet.py.
"""

from __future__ import annotations

from proxy_addon.gate import leases
from proxy_addon.store import PostgresStore


def test_recovery_reads_which_leases_live_only_after_the_receipts_in_flight(pg_url, monkeypatch):
    """A lease found expired, then taken again, must not lose the receipts committed under its new taking:
    leases.recover_expired asks which leases live only once the receipts in flight were read."""
    store = PostgresStore.open(pg_url)
    try:
        store.claim_lease("live-1", "h", 1, 30)
        order: list[str] = []
        rows, live = store._rows, store.live_instances

        def logged_rows(sql, params=()):
            if "FROM receipts WHERE state IN" in sql:
                order.append("receipts in flight")
            return rows(sql, params)

        def logged_live():
            order.append("live leases")
            return live()

        monkeypatch.setattr(store, "_rows", logged_rows)
        monkeypatch.setattr(store, "live_instances", logged_live)
        from tests.store.test_receipts import attempt

        store.begin_attempt(attempt("fp-x", instance="other-1"))
        assert leases.recover_expired(store, "live-1") == [(store.list(limit=None)[0].operation_id, "outcome_unknown")]
        assert order == ["receipts in flight", "live leases"]
        r = store.list(limit=None)[0]
        assert r.completed_at is None and r.updated_at is not None  # nobody saw its attempt end
    finally:
        store.close()

"""
What the proxies of a fleet share on one PostgreSQL store, besides the receipts: their instance
leases (liveness across machines, kept by heartbeats: proxy_addon/gate/leases.py drives them; a new
receipt is written only while its proxy's lease holds, and sent only while it still does:
gate/send_guard.py) and the fleet's key check (one HMAC key
for every proxy, or their fingerprints would differ). A mixin of postgres.py's `PostgresStore`,
in PostgreSQL's SQL (`now()`, `make_interval`, `ON CONFLICT`); SQLite's liveness is a flock
(gate/instances.py). The key check (one HMAC key for every proxy, or their fingerprints would
differ) is both backends' (key_check.py).
"""

from __future__ import annotations

from typing import Any

from proxy_addon.errors import StoreUnavailable
from proxy_addon.store.receipts import ReceiptStore
from proxy_addon.store.records import Attempt


class PostgresFleet(ReceiptStore):
    """Instance leases, over the backend's primitives (base.py)."""

    lease: tuple[str, float] | None  # (instance, seconds): new receipts need it to hold (set by PostgresStore)

    def claim_lease(self, instance: str, host: str, pid: int, seconds: float) -> None:
        """Hold (or take again) a lease for `instance` until `seconds` from now, in the server's time."""
        with self._write(intents=()):  # its lease row alone
            self._execute(
                "INSERT INTO receipt_instances (instance, host, pid, expires_at) "
                "VALUES (?, ?, ?, now() + make_interval(secs => ?)) ON CONFLICT (instance) DO UPDATE "
                "SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at",
                (instance, host, pid, seconds),
            )
        self.lease = (instance, seconds)

    def renew_lease(self, instance: str, host: str, pid: int, seconds: float) -> bool:
        """The heartbeat: extend the lease; False when it had expired (it is taken again all the same)."""
        with self._write(intents=()):  # its lease row alone
            live = self._execute(
                "UPDATE receipt_instances SET heartbeat_at = now(), expires_at = now() + make_interval(secs => ?) "
                "WHERE instance = ? AND expires_at > now()",
                (seconds, instance),
            )
        if not live:
            self.claim_lease(instance, host, pid, seconds)
        return bool(live)

    def drop_lease(self, instance: str) -> None:
        """A clean stop: the lease row goes (its receipts, if any were left in flight, are recovered)."""
        with self._write(intents=()):  # its lease row alone
            self._execute("DELETE FROM receipt_instances WHERE instance = ?", (instance,))

    def live_instances(self) -> set[str]:
        """The instances whose lease has not expired (the server's clock decides)."""
        return {r["instance"] for r in self._rows("SELECT instance FROM receipt_instances WHERE expires_at > now()")}

    def leases(self) -> dict[str, dict[str, Any]]:
        """Every lease row: instance → host, pid, heartbeat_at, expires_at, expired."""
        rows = self._rows(
            "SELECT instance, host, pid, heartbeat_at, expires_at, expires_at <= now() AS expired "
            "FROM receipt_instances"
        )
        return {r["instance"]: r for r in rows}

    def forget_leases(self, older_than: float) -> int:
        """Delete lease rows expired more than `older_than` seconds ago (their receipts were recovered long since)."""
        with self._write(intents=()):  # its lease row alone
            return self._execute(
                "DELETE FROM receipt_instances WHERE expires_at < now() - make_interval(secs => ?)", (older_than,)
            )

    def _hold_lease(self, a: Attempt) -> None:
        """A new receipt, or the next round of one (rounds.py), only while this proxy's lease holds (renewed here)."""
        if self.lease is not None and a.instance == self.lease[0]:
            held = self._execute(
                "UPDATE receipt_instances SET expires_at = greatest(expires_at, now() + make_interval(secs => ?)) "
                "WHERE instance = ? AND expires_at > now()",
                (self.lease[1], a.instance),
            )
            if not held:
                raise StoreUnavailable(
                    f"this proxy's lease on {self.location} has expired (no heartbeat reached the database in time): "
                    "other proxies may be recovering its receipts, so nothing is sent until the heartbeat renews it"
                )

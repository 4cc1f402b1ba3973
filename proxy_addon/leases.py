"""
Liveness across machines, for proxies sharing one PostgreSQL store.

A proxy cannot see another machine's `flock` (instances.py, SQLite's way), so each instance
holds a lease row in the database (`receipt_instances`) and renews it every `heartbeat`
seconds for `lease` seconds, in the server's clock. A `Heartbeat` thread, with a connection
of its own, renews this instance's lease and, on the same beat, moves the in-flight receipts
of instances whose lease expired: `submitted` and `reconciling` → `outcome_unknown`,
`awaiting_approval` → `not_sent`, with an event naming the instance. It never retries them.

A proxy whose own lease expired (its heartbeats did not reach the database in time) sends
nothing new until the heartbeat takes the lease again: PostgresStore checks the lease in the
transaction that records each new attempt.

    beat = Heartbeat(db, instance, lease=15, heartbeat=5, on_recovered=log)
    beat.start()
    ...
    beat.stop()     # drops the lease row: a clean stop leaves nothing to recover
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from proxy_addon.errors import ReceiptsError
from proxy_addon.store import PostgresStore, ReceiptStore

logger = logging.getLogger(__name__)

FORGET_AFTER = 86400.0  # seconds after its expiry that a lease row is deleted


def host() -> str:
    return socket.gethostname()


def recover_expired(store: PostgresStore, instance: str, *, actor: str | None = None) -> list[tuple[str, str]]:
    """Move the in-flight receipts of instances whose lease expired (not `instance`'s): (id, new state) each."""
    live = store.live_instances()
    leases = store.leases()

    def stopped(other: str | None) -> str:
        row = leases.get(other or "")
        if row is None:
            return f"proxy instance {other or '(none recorded)'} stopped (it holds no lease)"
        return (
            f"proxy instance {other} on {row['host']} (pid {row['pid']}) stopped: its lease expired "
            f"(last heartbeat {row['heartbeat_at'].isoformat(timespec='seconds')})"
        )

    ids = store.recover_in_flight(
        is_alive=lambda i: i == instance or i in live, actor=actor or f"proxy {instance}", stopped=stopped
    )
    return [(i, str(store.get(i).state)) for i in ids]


class Heartbeat:
    """Renews one instance's lease, and recovers expired instances' receipts, on a thread of its own."""

    def __init__(
        self,
        db: str,
        instance: str,
        *,
        lease: float,
        heartbeat: float,
        lock_timeout: float = 5.0,
        on_recovered: Callable[[list[tuple[str, str]]], None] = lambda ids: None,
    ):
        self.db, self.instance = db, instance
        self.lease, self.heartbeat, self.lock_timeout = lease, heartbeat, lock_timeout
        self.on_recovered = on_recovered
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: PostgresStore | None = None
        self.beats = 0  # heartbeats that reached the database (for tests and logs)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="receipts-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        warned = False
        while not self._stop.wait(self.heartbeat):
            try:
                self.beat()
                if warned:
                    logger.warning("receipt-proxy: heartbeat reaches the receipts database again")
                warned = False
            except ReceiptsError as e:
                if not warned:
                    logger.error(
                        f"receipt-proxy: heartbeat failed (the lease of instance {self.instance} lasts "
                        f"{self.lease:g}s from the last one that reached the database): {e}"
                    )
                warned = True
                if self._store is not None:
                    self._store.close()
                    self._store = None

    def beat(self) -> None:
        """One heartbeat: renew the lease, then recover the receipts of expired instances."""
        if self._store is None:
            self._store = PostgresStore.open(self.db, lock_timeout=self.lock_timeout, create=False)
        if not self._store.renew_lease(self.instance, host(), os.getpid(), self.lease):
            logger.warning(
                f"receipt-proxy: the lease of instance {self.instance} had expired (no heartbeat reached the "
                "database in time); taken again: its receipts in flight may have been recovered as outcome_unknown"
            )
        self.beats += 1
        recovered = recover_expired(self._store, self.instance)
        if recovered:
            self.on_recovered(recovered)
        if self.beats % 100 == 1:
            self._store.forget_leases(FORGET_AFTER)

    def stop(self) -> None:
        """Stop beating and drop the lease row."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lock_timeout + 10)
        try:
            store = self._store or PostgresStore.open(self.db, lock_timeout=self.lock_timeout, create=False)
            store.drop_lease(self.instance)
            store.close()
        except ReceiptsError as e:
            logger.warning(f"receipt-proxy: could not drop the lease of instance {self.instance}: {e}")
        self._store = None


def is_fleet(store: ReceiptStore) -> bool:
    """Whether a store is shared across machines (leases), rather than a local file (flock)."""
    return isinstance(store, PostgresStore)

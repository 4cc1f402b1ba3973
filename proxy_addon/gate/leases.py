"""
Liveness across machines, for proxies sharing one PostgreSQL store.

A proxy cannot see another machine's `flock` (gate/instances.py, SQLite's way), so each instance
holds a lease row in the database (`receipt_instances`) and renews it every `heartbeat`
seconds for `lease` seconds, in the server's clock. A `Heartbeat` thread, with a connection
of its own, renews this instance's lease and, on the same beat, moves the in-flight receipts
of instances whose lease expired: `submitted` and `reconciling` → `outcome_unknown`,
`awaiting_approval` → `not_sent`, with an event naming the instance. It never retries them.

A proxy whose own lease expired (its heartbeats did not reach the database in time) sends
nothing new until the heartbeat takes the lease again: PostgresStore checks the lease in the
transaction that records each new attempt. And a receipt already committed is sent only while
the lease still holds, with a margin, just before its first byte: `HeldLease` is what this
process knows of its own lease, on its own clock, without asking the database; gate/send_guard.py
checks it and says why that is enough (a paused process that wakes after its lease expired
sends nothing).

    beat = Heartbeat(db, instance, lease=15, heartbeat=5, on_recovered=log)   # log(receipts), each as it is now
    beat.start()
    ...
    beat.stop()     # drops the lease row: a clean stop leaves nothing to recover
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from proxy_addon.errors import ReceiptsError
from proxy_addon.store import PostgresStore, Receipt, ReceiptStore

logger = logging.getLogger(__name__)

FORGET_AFTER = 86400.0  # seconds after its expiry that a lease row is deleted


def local_clock() -> float:
    """
    Seconds on a clock of this machine that keeps counting while this process is stopped
    (SIGSTOP, a GC pause, swapped out) and while the machine is suspended: CLOCK_BOOTTIME on
    Linux, else the monotonic clock. Never set, never stepped: only its elapsed time is used.
    """
    return time.clock_gettime(_BOOTTIME)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class HeldLease:
    """
    This process's own lease as it knows it, on `local_clock`, without asking the database:
    held until `until`, by the renewals that reached the database (`renewed`, each counted from
    before its statement was sent, so never later than the database's expiry), in its `epoch`'th
    taking. A lease taken again after it expired starts a new epoch: another proxy may have
    recovered what was committed under the old one. Written by the heartbeat's thread, read on
    the event loop: (epoch, until) is replaced as one tuple.

        held = HeldLease(15, margin=5)
        epoch = held.epoch                    # before the receipt is committed
        ...
        why = held.refusal(epoch)             # just before its first byte: None, or why not
    """

    def __init__(self, seconds: float, *, margin: float):
        self.seconds, self.margin = seconds, margin
        self._held: tuple[int, float] = (0, -float("inf"))

    def renewed(self, started: float, *, continuous: bool) -> None:
        """
        A renewal (or a first claim) reached the database. `started`: `local_clock()` read before
        its statement was sent. `continuous`: the database found the lease still held (renewed,
        not taken again).
        """
        epoch, until = self._held
        if continuous:
            self._held = (epoch, max(until, started + self.seconds))
        else:
            self._held = (epoch + 1, started + self.seconds)

    def dropped(self) -> None:
        """The lease row is gone (a clean stop): nothing committed before may be sent any more."""
        self._held = (self._held[0] + 1, -float("inf"))

    @property
    def epoch(self) -> int:
        return self._held[0]

    def left(self) -> float:
        """Seconds the lease is known to hold from now (negative: it may have expired)."""
        return self._held[1] - local_clock()

    def refusal(self, epoch: int) -> str | None:
        """Why a receipt committed in `epoch` may not be sent now (gate/send_guard.py), or None."""
        now_epoch, until = self._held
        if now_epoch != epoch:
            return (
                "this proxy's lease expired and was taken again since the receipt was committed: another proxy "
                "may have taken the receipt over"
            )
        left = until - local_clock()
        if left < self.margin:
            return (
                f"this proxy's lease is known to hold for {max(left, 0.0):.1f}s more, less than the "
                f"{self.margin:g}s a send needs (its heartbeats have not reached the database in time): another proxy "
                "may take the receipt over"
            )
        return None


def send_margin(lease: float, heartbeat: float) -> float:
    """
    The lease a send needs left: half of what the lease outlasts a heartbeat by. A lease renewed
    on time always has more (`lease - heartbeat`, less the heartbeat's own time); one whose
    heartbeats are late by half that stops sending until a renewal gets through.
    """
    return (lease - heartbeat) / 2


def host() -> str:
    return socket.gethostname()


def recover_expired(store: PostgresStore, instance: str, *, actor: str | None = None) -> list[tuple[str, str]]:
    """
    Move the in-flight receipts of instances whose lease expired (not `instance`'s): (id, new
    state) each. Which leases are live is read after the receipts in flight (`recover_in_flight`
    reads them before it asks `is_alive`): a receipt is moved only for a lease that expired after
    it was committed (at commit the lease held: fleet.py). Read before, a lease expired then and
    taken again since would lose the receipts committed under its new taking (gate/send_guard.py).
    """
    live: set[str] | None = None
    leases: dict[str, dict[str, Any]] = {}

    def is_alive(other: str | None) -> bool:
        nonlocal live
        if other == instance:
            return True
        if live is None:
            live = store.live_instances()
            leases.update(store.leases())
        return other in live

    def stopped(other: str | None) -> str:
        row = leases.get(other or "")
        if row is None:
            return f"proxy instance {other or '(none recorded)'} stopped (it holds no lease)"
        return (
            f"proxy instance {other} on {row['host']} (pid {row['pid']}) stopped: its lease expired "
            f"(last heartbeat {row['heartbeat_at'].isoformat(timespec='seconds')})"
        )

    ids = store.recover_in_flight(is_alive=is_alive, actor=actor or f"proxy {instance}", stopped=stopped)
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
        on_recovered: Callable[[list[Receipt]], None] = lambda receipts: None,
        held: HeldLease | None = None,
    ):
        self.db, self.instance = db, instance
        self.held = held  # what this process knows of its lease: each renewal that got through updates it
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
        started = local_clock()
        continuous = self._store.renew_lease(self.instance, host(), os.getpid(), self.lease)
        if self.held is not None:
            self.held.renewed(started, continuous=continuous)
        if not continuous:
            logger.warning(
                f"receipt-proxy: the lease of instance {self.instance} had expired (no heartbeat reached the "
                "database in time); taken again: its receipts in flight may have been recovered as outcome_unknown"
            )
        self.beats += 1
        recovered = recover_expired(self._store, self.instance)
        if recovered:  # each as it is now (its state, its trace_parent: a span linked to the write's)
            self.on_recovered([self._store.get(operation_id) for operation_id, _ in recovered])
        if self.beats % 100 == 1:
            self._store.forget_leases(FORGET_AFTER)

    def stop(self) -> None:
        """Stop beating and drop the lease row."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lock_timeout + 10)
        if self.held is not None:
            self.held.dropped()
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

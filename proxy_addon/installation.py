"""
One proxy process's hold on its receipts: the database, the HMAC key, and its instance claim.

    inst = Installation.open("~/.local/state/receipt-proxy/receipts.db", lock_timeout=5)
    for operation_id, state in inst.recover(): ...   # in-flight receipts of proxies that died
    inst.close()

The key (secret.key beside the database unless named) hashes credentials into principals;
the instance claim (instances.py) tells the other processes sharing the database that this
one is alive, so that only the receipts of dead proxies are recovered.

On PostgreSQL (a fleet of proxies, possibly on several machines) the claim is a lease row
renewed by a heartbeat thread (leases.py) instead of a flock, the key is the state
directory's secret.key unless `secret` names one, and the fleet must share that key: the
database keeps a check value of it, and a proxy with another key refuses to start (its
fingerprints would differ, and the same write would not be seen as a duplicate).

A missing database beside an existing key or instances folder means the database was
removed or moved, and an empty one would let every write through again: `open` refuses to
create it unless `new_db` says that starting over is intended.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy_addon import instances, leases
from proxy_addon.errors import StoreError
from proxy_addon.fingerprint import load_or_create_key
from proxy_addon.paths import key_path
from proxy_addon.store import PostgresStore, ReceiptStore, is_postgres, open_store

LEASE = 15.0  # seconds an instance's lease lasts without a heartbeat (receipts_lease)
HEARTBEAT = 5.0  # seconds between two heartbeats (receipts_heartbeat)


@dataclass
class Installation:
    db: Path | str
    store: ReceiptStore
    key: bytes
    instance: str
    _lock_fd: int | None
    heartbeat: leases.Heartbeat | None = None
    lease: leases.HeldLease | None = None  # PostgreSQL: this process's lease as it knows it (send_guard.py)

    @classmethod
    def open(
        cls,
        db: str | Path,
        *,
        secret: str | None = None,
        lock_timeout: float = 5.0,
        new_db: bool = False,
        lease: float = LEASE,
        heartbeat: float = HEARTBEAT,
        on_recovered: Callable[[list[tuple[str, str]]], None] = lambda ids: None,
    ) -> Installation:
        """
        Open (creating where needed) the database and key, and claim an instance id.
        Raises ReceiptsError, OSError, ValueError.
        """
        if is_postgres(db):
            return cls._open_postgres(
                str(db), secret, lock_timeout, lease=lease, heartbeat=heartbeat, on_recovered=on_recovered
            )
        path = Path(db).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file = key_path(path, secret)
        if not path.exists() and not new_db:
            left = [p for p in (key_file, instances.directory(path)) if p.exists()]
            if left:
                raise StoreError(
                    f"{path} does not exist, but {' and '.join(str(p) for p in left)} does: the receipts database "
                    "was removed or moved, and an empty one would forget every unresolved receipt. Restore it, or "
                    "start over on purpose with --set receipts_new_db=true (README: 'Starting over')"
                )
        key = load_or_create_key(key_file)
        store = open_store(path, lock_timeout=lock_timeout)
        instance, lock_fd = instances.claim(path)
        return cls(path, store, key, instance, lock_fd)

    @classmethod
    def _open_postgres(
        cls,
        db: str,
        secret: str | None,
        lock_timeout: float,
        *,
        lease: float,
        heartbeat: float,
        on_recovered: Callable[[list[tuple[str, str]]], None],
    ) -> Installation:
        key_file = key_path(db, secret)
        key = load_or_create_key(key_file)
        store = open_store(db, lock_timeout=lock_timeout)
        assert isinstance(store, PostgresStore)
        try:
            mine = key_check(key)
            fleet = store.check_key(mine)
            if fleet != mine:
                raise StoreError(
                    f"the HMAC key {key_file} is not the one the other proxies on {store.location} use: every proxy "
                    "of a fleet needs the same secret.key (copy theirs here, or point receipts_secret at it), or the "
                    "same write would get another fingerprint on each and not be seen as a duplicate"
                )
            instance = f"{leases.host()}-{os.getpid()}-{secrets.token_hex(4)}"
            held = leases.HeldLease(lease, margin=leases.send_margin(lease, heartbeat))
            started = leases.local_clock()
            store.claim_lease(instance, leases.host(), os.getpid(), lease)
            held.renewed(started, continuous=False)
        except BaseException:
            store.close()
            raise
        beat = leases.Heartbeat(
            db,
            instance,
            lease=lease,
            heartbeat=heartbeat,
            lock_timeout=lock_timeout,
            on_recovered=on_recovered,
            held=held,
        )
        beat.start()
        return cls(db, store, key, instance, None, beat, held)

    def recover(self, store: ReceiptStore | None = None) -> list[tuple[str, str]]:
        """Move the in-flight receipts of stopped proxies on (see Store.recover_in_flight): (id, new state) each."""
        store = store or self.store
        if isinstance(store, PostgresStore):
            return leases.recover_expired(store, self.instance)
        assert isinstance(self.db, Path)
        db = self.db
        recovered = store.recover_in_flight(is_alive=lambda i: i == self.instance or instances.alive(db, i))
        return [(operation_id, str(store.get(operation_id).state)) for operation_id in recovered]

    def release(self) -> None:
        """Give up the instance claim (the store is closed by whoever runs its calls)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def key_check(key: bytes) -> str:
    """What the database keeps of a fleet's HMAC key: a keyed hash of a fixed text (the key cannot be found from it)."""
    return hmac.new(key, b"receipt-proxy fleet key check", hashlib.sha256).hexdigest()[:32]

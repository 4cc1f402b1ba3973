"""
One proxy process's hold on its receipts: the database, the HMAC key, and its instance claim.

    inst = Installation.open("~/.local/state/receipt-proxy/receipts.db", lock_timeout=5)
    for operation_id, state in inst.recover(): ...   # in-flight receipts of proxies that died
    inst.close()

The key (secret.key beside the database unless named) hashes credentials into principals,
and a key derived from it seals the answers recorded for replay (store/sealing.py); the
instance claim (gate/instances.py) tells the other processes sharing the database that this one is
alive, so that only the receipts of dead proxies are recovered.

The database keeps a check value of its key (store/key_check.py), on both backends: a proxy
started with another key, or with none beside a database that holds receipts or a check
value, refuses to start. With a new key every principal, so every fingerprint, would change:
an unresolved write's retry would be sent again, and a success not replayed. A new key is made
only for a database that holds nothing yet.

On PostgreSQL (a fleet of proxies, possibly on several machines) the claim is a lease row
renewed by a heartbeat thread (gate/leases.py) instead of a flock, the key is the state
directory's secret.key unless `secret` names one, and the fleet shares that key.

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

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.errors import StoreError
from proxy_addon.gate import instances, leases
from proxy_addon.gate.paths import key_path
from proxy_addon.intent.fingerprint import load_or_create_key
from proxy_addon.proof.signing_key import KEY_FILE, load_or_create_signing_key, verifier_key
from proxy_addon.store import PostgresStore, Receipt, ReceiptStore, is_postgres, open_store
from proxy_addon.store.sealing import AnswerSeal

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
    lease: leases.HeldLease | None = None  # PostgreSQL: this process's lease as it knows it (gate/send_guard.py)
    signing_key: Ed25519PrivateKey | None = None  # checkpoint.key beside secret.key: signs checkpoints (docs/proof.md)

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
        on_recovered: Callable[[list[Receipt]], None] = lambda receipts: None,
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
                    "start over on purpose with --set receipts_new_db=true (docs/operations.md: 'Starting over')"
                )
        store = open_store(path, lock_timeout=lock_timeout)
        try:
            key = _checked_key(store, key_file)
            signing_key = checked_signing_key(store, key_file.parent / KEY_FILE)
            instance, lock_fd = instances.claim(path)
        except BaseException:
            store.close()
            raise
        return cls(path, store, key, instance, lock_fd, signing_key=signing_key)

    @classmethod
    def _open_postgres(
        cls,
        db: str,
        secret: str | None,
        lock_timeout: float,
        *,
        lease: float,
        heartbeat: float,
        on_recovered: Callable[[list[Receipt]], None],
    ) -> Installation:
        key_file = key_path(db, secret)
        store = open_store(db, lock_timeout=lock_timeout)
        assert isinstance(store, PostgresStore)
        try:
            key = _checked_key(store, key_file)
            signing_key = checked_signing_key(store, key_file.parent / KEY_FILE)
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
        return cls(db, store, key, instance, None, beat, held, signing_key)

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
    """What the database keeps of its HMAC key: a keyed hash of a fixed text (the key cannot be found from it)."""
    return hmac.new(key, b"receipt-proxy fleet key check", hashlib.sha256).hexdigest()[:32]


def _checked_key(store: ReceiptStore, key_file: Path) -> bytes:
    """
    The HMAC key for `store`, from `key_file`, once the database's check value says it is the
    key its receipts were made with (store/key_check.py); the store then seals and opens
    recorded answers with a key derived from it. A missing key file is made only for a
    database that holds no receipt and no check value. StoreError, in one line naming the
    files and what to do, when the key is missing or another.
    """
    fleet = isinstance(store, PostgresStore)
    # The database first, then the file: a proxy that records the check value made its key file
    # before, so a fleet's proxies starting at once on one key path see the file once they see it.
    used = store.recorded_key_check() is not None or store.holds_receipts()
    if used and not key_file.exists():
        if fleet:
            raise StoreError(
                f"the HMAC key {key_file} is missing, and the other proxies on {store.location} use one: every proxy "
                "of a fleet needs the same secret.key (copy theirs here, or point receipts_secret at it), or the "
                "same write would get another fingerprint on each and not be seen as a duplicate"
            )
        made = "holds receipts made" if store.holds_receipts() else "was used"
        raise StoreError(
            f"the HMAC key {key_file} is missing, but the receipts database {store.location} {made} "
            f"with it: a new key would change every principal, so unresolved writes would be sent again and "
            f"successes not replayed. Restore {key_file.name} from a backup (or point receipts_secret at it); or, "
            f"knowingly, start over: move {store.location} away and start with --set receipts_new_db=true "
            "(docs/operations.md: 'Starting over')"
        )
    key = load_or_create_key(key_file)
    mine = key_check(key)
    if store.check_key(mine) != mine:
        if fleet:
            raise StoreError(
                f"the HMAC key {key_file} is not the one the other proxies on {store.location} use: every proxy "
                "of a fleet needs the same secret.key (copy theirs here, or point receipts_secret at it), or the "
                "same write would get another fingerprint on each and not be seen as a duplicate"
            )
        raise StoreError(
            f"the HMAC key {key_file} is not the one the receipts database {store.location} was used with: it "
            f"would change every principal, so unresolved writes would be sent again and successes not replayed. "
            f"Restore the original {key_file.name} (or point receipts_secret at it); or, knowingly, start over: "
            f"move {store.location} away and start with --set receipts_new_db=true "
            "(docs/operations.md: 'Starting over')"
        )
    store.answer_seal = AnswerSeal(key)
    return key


def checked_signing_key(store: ReceiptStore, key_file: Path) -> Ed25519PrivateKey:
    """
    The checkpoint key from `key_file` (checkpoint.key beside secret.key), made when the database
    records no verifier key yet, once the database's verifier key says it is the fleet's. StoreError,
    naming the files and what to do, when the key is missing or another: checkpoints signed with it
    would not verify with the key the database gives verifiers.
    """
    recorded = store.recorded_checkpoint_key()
    if recorded is not None and not key_file.exists():
        raise StoreError(
            f"the checkpoint key {key_file} is missing, and {store.location} records the key its checkpoints are "
            f"signed with ({recorded.split('+')[1]}): copy the fleet's {key_file.name} here, beside secret.key "
            "(docs/proof.md: 'The checkpoint key')"
        )
    try:
        key = load_or_create_signing_key(key_file)
    except (ValueError, OSError) as e:
        raise StoreError(f"cannot use the checkpoint key: {e}") from None
    mine = verifier_key(key)
    if store.check_checkpoint_key(mine) != mine:
        raise StoreError(
            f"the checkpoint key {key_file} is not the one {store.location} records its checkpoints signed with: "
            f"copy the fleet's {key_file.name} here, beside secret.key (docs/proof.md: 'The checkpoint key')"
        )
    return key

"""
One proxy process's hold on its receipts: the database, the HMAC key, and its instance claim.

    inst = Installation.open("~/.local/state/receipt-proxy/receipts.db", lock_timeout=5)
    for operation_id, state in inst.recover(): ...   # in-flight receipts of proxies that died
    inst.close()

The key (secret.key beside the database unless named) hashes credentials into principals;
the instance claim (instances.py) tells the other processes sharing the database that this
one is alive, so that only the receipts of dead proxies are recovered.

A missing database beside an existing key or instances folder means the database was
removed or moved, and an empty one would let every write through again: `open` refuses to
create it unless `new_db` says that starting over is intended.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from proxy_addon import instances
from proxy_addon.errors import StoreError
from proxy_addon.fingerprint import load_or_create_key
from proxy_addon.paths import key_path
from proxy_addon.store import Store


@dataclass
class Installation:
    db: Path
    store: Store
    key: bytes
    instance: str
    _lock_fd: int | None

    @classmethod
    def open(
        cls, db: str | Path, *, secret: str | None = None, lock_timeout: float = 5.0, new_db: bool = False
    ) -> Installation:
        """
        Open (creating where needed) the database and key, and claim an instance id.
        Raises ReceiptsError, OSError, ValueError.
        """
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
        store = Store.open(path, lock_timeout=lock_timeout)
        instance, lock_fd = instances.claim(path)
        return cls(path, store, key, instance, lock_fd)

    def recover(self, store: Store | None = None) -> list[tuple[str, str]]:
        """Move the in-flight receipts of stopped proxies on (see Store.recover_in_flight): (id, new state) each."""
        store = store or self.store
        recovered = store.recover_in_flight(is_alive=lambda i: i == self.instance or instances.alive(self.db, i))
        return [(operation_id, str(store.get(operation_id).state)) for operation_id in recovered]

    def release(self) -> None:
        """Give up the instance claim (the store is closed by whoever runs its calls)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

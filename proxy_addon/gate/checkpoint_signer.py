"""
Signing checkpoints of the events' chain (docs/proof.md, "Checkpoints"), on a thread of its own:
every `every_events` new records or every `every_seconds` (whichever comes first, and only when
the chain grew), the signer reads the chain's committed tip and keeps a signed note of it.

    signer = CheckpointSigner(db, key, every_events=1000, every_seconds=60)
    signer.start() ... signer.stop()      # stop signs the tip once more, when it grew

A fleet's proxies each run one, with the one key: two that sign the same tip keep one note
(the size is the table's key). A failure is logged once until the next success; the chain is
unaffected, and the next checkpoint covers what this one would have.
"""

from __future__ import annotations

import logging
import threading
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.errors import ReceiptsError
from proxy_addon.proof.checkpoint_notes import sign_checkpoint
from proxy_addon.store import ReceiptStore, iso, open_store

logger = logging.getLogger("proxy_addon.gate.checkpoint_signer")
POLL = 1.0  # seconds between two looks at the chain's tip (at most)


class CheckpointSigner:
    """Signs the chain's tip every N records or T seconds; `sign()` once, for tests and at the end."""

    def __init__(
        self, db: str, key: Ed25519PrivateKey, *, every_events: int, every_seconds: float, lock_timeout: float = 5.0
    ):
        self.db, self.key = db, key
        self.every_events, self.every_seconds, self.lock_timeout = every_events, every_seconds, lock_timeout
        self._store: ReceiptStore | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._signed_size: int | None = None  # the last size signed (or found signed)
        self._signed_at = time.monotonic()
        self.signed = 0  # checkpoints this signer kept

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="receipts-checkpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then sign the tip once more if it grew (a clean stop leaves the chain signed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lock_timeout + 5)
        try:
            self.sign(force=True)
        except ReceiptsError as e:
            logger.warning(f"receipt-proxy: cannot sign a last checkpoint: {e}")
        finally:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _run(self) -> None:
        warned = False
        while not self._stop.wait(min(POLL, self.every_seconds)):
            try:
                self.sign()
                warned = False
            except ReceiptsError as e:
                if not warned:
                    logger.error(f"receipt-proxy: cannot sign a checkpoint of the receipts' history: {e}")
                warned = True
                if self._store is not None:
                    self._store.close()
                    self._store = None

    def sign(self, *, force: bool = False) -> bool:
        """Sign the committed tip if it is due (or, `force`, whenever it grew); whether a checkpoint was kept."""
        if self._store is None:
            self._store = open_store(self.db, lock_timeout=self.lock_timeout, create=False)
        store = self._store
        if self._signed_size is None:
            last = store.last_checkpoint()
            self._signed_size = int(last["size"]) if last else 0
        size, head = store.chain_tip()
        grown = size - self._signed_size
        due = grown >= self.every_events or time.monotonic() - self._signed_at >= self.every_seconds
        if grown <= 0 or not (due or force):
            return False
        at = iso(store.clock())
        kept = store.record_checkpoint(size, head, at, sign_checkpoint(self.key, size, head, at))
        self._signed_size, self._signed_at = size, time.monotonic()
        self.signed += kept
        return kept

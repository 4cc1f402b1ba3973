"""
The signed checkpoints a database keeps (`receipt_checkpoints`, m017), and the verifier key of
the fleet that signs them (`receipt_settings`, name 'checkpoint_key'), checked when a proxy
starts as the key check of secret.key is (gate/installation.py). The notes are made and opened
by proof/checkpoint_notes.py; this is where they are kept.
"""

from __future__ import annotations

from typing import Any

from proxy_addon.store.hash_chain import ReceiptChain


class ReceiptCheckpoints(ReceiptChain):
    """Signed checkpoints, and the verifier key they are checked with."""

    def recorded_checkpoint_key(self) -> str | None:
        """The fleet's verifier key, or None (no proxy with a checkpoint key has opened the database)."""
        rows = self._rows("SELECT value FROM receipt_settings WHERE name = 'checkpoint_key'")
        return str(rows[0]["value"]) if rows else None

    def check_checkpoint_key(self, verifier: str) -> str:
        """Record `verifier` as the fleet's verifier key if there is none yet; the one recorded (compare it)."""
        with self._write():
            self._execute(
                "INSERT INTO receipt_settings (name, value) VALUES ('checkpoint_key', ?) ON CONFLICT (name) DO NOTHING",
                (verifier,),
            )
            return str(self._rows("SELECT value FROM receipt_settings WHERE name = 'checkpoint_key'")[0]["value"])

    def record_checkpoint(self, size: int, head: str, at: str, note: str) -> bool:
        """Keep a signed checkpoint; False when one of that size is kept already (another proxy signed it)."""
        with self._write(durable=False):
            return (
                self._execute(
                    "INSERT INTO receipt_checkpoints (size, head, at, note) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (size) DO NOTHING",
                    (size, head, at, note),
                )
                == 1
            )

    def checkpoints(self) -> list[dict[str, Any]]:
        """Every signed checkpoint (size, head, at, note), smallest first."""
        return self._rows("SELECT size, head, at, note FROM receipt_checkpoints ORDER BY size")

    def last_checkpoint(self) -> dict[str, Any] | None:
        rows = self._rows("SELECT size, head, at, note FROM receipt_checkpoints ORDER BY size DESC LIMIT 1")
        return rows[0] if rows else None

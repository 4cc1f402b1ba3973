"""
What a receipts database keeps of the installation's `secret.key`: a check value (a keyed hash
of a fixed text; the key cannot be found from it) in `receipt_settings`, on both backends
(PostgreSQL since m008, SQLite since m011). The key makes every principal, so every
fingerprint: a database used with another key would see no retry as a duplicate. Which key
may open which database, and what is said when it may not, is gate/installation.py's
(`Installation.open`); these are the reads and the one write it needs.
"""

from __future__ import annotations

from proxy_addon.store.base import Backend


class ReceiptKeyCheck(Backend):
    """The database's check value of its secret.key, and whether it holds receipts made with it."""

    def recorded_key_check(self) -> str | None:
        """The check value recorded, or None (a new database, or one made before it kept one)."""
        rows = self._rows("SELECT value FROM receipt_settings WHERE name = 'key_check'")
        return str(rows[0]["value"]) if rows else None

    def check_key(self, check: str) -> str:
        """Record `check` as the key's check value if there is none yet; the one recorded (compare it with yours)."""
        with self._write():
            self._execute(
                "INSERT INTO receipt_settings (name, value) VALUES ('key_check', ?) ON CONFLICT (name) DO NOTHING",
                (check,),
            )
            return str(self._rows("SELECT value FROM receipt_settings WHERE name = 'key_check'")[0]["value"])

    def holds_receipts(self) -> bool:
        """Whether any receipt is stored (made with some key: its principals and fingerprints depend on it)."""
        return bool(self._rows("SELECT 1 AS found FROM receipts LIMIT 1"))
